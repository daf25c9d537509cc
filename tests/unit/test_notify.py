"""The waiter registry of ``jobs.index.notify`` and the tenant cache, without Redis or SQL."""

from __future__ import annotations

import asyncio
import threading

from jobs.core.domain import Tenant
from jobs.index.notify import Waiters
from jobs.service.tenant_cache import TenantCache

# -- waiters --------------------------------------------------------------------------------


def test_a_ring_wakes_the_waiters_of_that_job_only() -> None:
    async def scenario() -> None:
        waiters, loop = Waiters(), asyncio.get_running_loop()
        a1, a2, b = waiters.add("a", loop), waiters.add("a", loop), waiters.add("b", loop)
        assert len(waiters) == 3
        assert waiters.wake(["a", "nobody"]) == 2
        assert await a1.wait(1.0) and await a2.wait(1.0)
        assert not await b.wait(0.05)
        # A ring is consumed by the wait it ended.
        assert not await a1.wait(0.05)

    asyncio.run(scenario())


def test_a_ring_before_the_wait_is_not_lost() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        waiter = waiters.add("a", asyncio.get_running_loop())
        waiters.wake(["a"])
        await asyncio.sleep(0)  # the hand-off runs on the loop
        assert await waiter.wait(0.0)

    asyncio.run(scenario())


def test_wake_all_and_discard() -> None:
    async def scenario() -> None:
        waiters, loop = Waiters(), asyncio.get_running_loop()
        a, b = waiters.add("a", loop), waiters.add("b", loop)
        assert waiters.wake_all() == 2
        assert await a.wait(1.0) and await b.wait(1.0)
        waiters.discard(a)
        waiters.discard(a)  # twice is harmless
        assert len(waiters) == 1
        assert waiters.wake(["a"]) == 0
        waiters.discard(b)
        assert len(waiters) == 0 and waiters.wake_all() == 0

    asyncio.run(scenario())


def test_a_ring_from_another_thread_reaches_the_loop() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        waiter = waiters.add("a", asyncio.get_running_loop())
        ringer = threading.Thread(target=waiters.wake, args=(["a"],))
        ringer.start()
        assert await waiter.wait(5.0)
        ringer.join()

    asyncio.run(scenario())


def test_a_closed_loop_is_skipped() -> None:
    waiters = Waiters()
    loop = asyncio.new_event_loop()
    waiters.add("a", loop)
    loop.close()
    assert waiters.wake(["a"]) == 1  # no error: nobody waits there any more


# -- tenant cache ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tenant(name: str, tier: str = "free") -> Tenant:
    return Tenant(id=f"id-{name}", name=name, tier=tier, api_key_hash=f"hash-{name}",
                  created_at=0.0)


def test_nothing_is_kept_unless_changes_are_heard_of() -> None:
    cache = TenantCache()
    assert not cache.put("h", tenant("a"), cache.generation)
    cache.set_live(True)
    assert cache.put("h", tenant("a"), cache.generation)
    assert cache.get("h") == tenant("a")
    cache.set_live(False)  # deaf: what is held may be stale, and nothing more is kept
    assert cache.get("h") is None and len(cache) == 0
    assert not cache.put("h", tenant("a"), cache.generation)


def test_entries_live_for_the_ttl() -> None:
    clock = Clock()
    cache = TenantCache(ttl_s=5.0, clock=clock)
    cache.set_live(True)
    cache.put("h", tenant("a"), cache.generation)
    clock.now = 4.9
    assert cache.get("h") is not None
    clock.now = 5.0
    assert cache.get("h") is None and len(cache) == 0


def test_a_read_that_raced_an_invalidation_is_not_kept() -> None:
    cache = TenantCache()
    cache.set_live(True)
    cache.put("h", tenant("a"), cache.generation)
    seen = cache.generation  # a request reads SQL...
    cache.invalidate()  # ...while an admin change lands
    assert cache.get("h") is None
    assert not cache.put("h", tenant("a"), seen)
    assert cache.put("h", tenant("a", "premium"), cache.generation)


def test_the_oldest_entry_makes_room() -> None:
    cache = TenantCache(max_entries=3)
    cache.set_live(True)
    for i in range(5):
        cache.put(f"h{i}", tenant(str(i)), cache.generation)
    assert len(cache) == 3
    assert cache.get("h0") is None and cache.get("h1") is None
    assert cache.get("h4") == tenant("4")
