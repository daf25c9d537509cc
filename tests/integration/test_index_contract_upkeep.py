"""The index contract, continued: leadership (the lock and the fence) and what a rebuild
from SQL needs. Both implementations pass it (fixtures in test_index_contract.py's style)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
import redis

from jobs.index import (
    DispatchIndex,
    Lease,
    NotLeader,
    RedisIndex,
    redis_upkeep,
)
from jobs.index.keys import IndexKeys
from jobs.index.values import TierDepth
from tests.integration.test_index_contract import TTL, fill, ids, job

pytestmark = pytest.mark.integration


# -- leadership: the lock and the fence --


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    """Poll ``predicate`` (real time: Redis's lock TTL runs on its own clock) until truthy."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
    return value


def test_one_contender_takes_the_lock_with_a_growing_token(index: DispatchIndex) -> None:
    now = time.time()
    first = index.acquire_leadership("a", ttl_s=60, now=now)
    assert first is not None and first.endswith(":a")
    assert index.acquire_leadership("b", ttl_s=60, now=now) is None
    assert index.acquire_leadership("a", ttl_s=60, now=now) is None  # held, even by itself
    assert index.leader(now=now) == first
    assert index.resign_leadership(first, now=now) is True
    second = index.acquire_leadership("b", ttl_s=60, now=now)
    assert second is not None and second.endswith(":b")
    assert int(second.split(":")[0]) > int(first.split(":")[0])


def test_renew_and_resign_only_with_the_holders_token(index: DispatchIndex) -> None:
    now = time.time()
    token = index.acquire_leadership("a", ttl_s=60, now=now)
    assert token is not None
    assert index.renew_leadership("1:b", ttl_s=60, now=now) is False
    assert index.resign_leadership("1:b", now=now) is False
    assert index.leader(now=now) == token
    assert index.renew_leadership(token, ttl_s=60, now=now) is True
    assert index.resign_leadership(token, now=now) is True
    assert index.resign_leadership(token, now=now) is False
    assert index.renew_leadership(token, ttl_s=60, now=now) is False
    assert index.leader(now=now) is None


def test_a_lock_not_renewed_lapses_and_another_takes_it(index: DispatchIndex) -> None:
    old = index.acquire_leadership("a", ttl_s=0.2, now=time.time())
    assert old is not None
    new = wait_for(lambda: index.acquire_leadership("b", ttl_s=60, now=time.time()))
    assert index.renew_leadership(old, ttl_s=60, now=time.time()) is False
    assert index.leader(now=time.time()) == new


def test_fenced_calls_refuse_a_token_that_is_not_the_leaders(index: DispatchIndex) -> None:
    fill(index, job("a", "t1", key=1.0, start_by=5.0), job("b", "t2", key=2.0))
    now = time.time()
    with pytest.raises(NotLeader):  # nobody leads
        index.dispatch(10, now=0.0, lease_ttl_s=TTL, fence="1:a")
    token = index.acquire_leadership("a", ttl_s=60, now=now)
    assert token is not None
    for call in (
        lambda: index.dispatch(10, now=0.0, lease_ttl_s=TTL, fence="9:x"),
        lambda: index.reap(now=100.0, fence="9:x"),
        lambda: index.expire_due(now=100.0, fence="9:x"),
    ):
        with pytest.raises(NotLeader):
            call()
    assert index.tier_depths(["free"])["free"].queued == 2  # nothing changed
    assert [j.job_id for j in index.expire_due(now=10.0, fence=token)] == ["a"]
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL, fence=token)) == ["b"]
    assert ids(index.reap(now=100.0, fence=token)) == ["b"]
    assert index.dispatch(10, now=0.0, lease_ttl_s=TTL) == []  # unfenced: as before


def test_every_leader_write_is_fenced(index: DispatchIndex) -> None:
    """Caps, requeues, releases, cancels, restored leases and the epoch: a deposed leader's
    late writes (a stale snapshot, a long rebuild) change nothing."""
    fill(index, job("q", "t1", key=1.0), job("l", "t2", key=2.0))
    now = time.time()
    token = index.acquire_leadership("a", ttl_s=60, now=now)
    assert token is not None
    index.dispatch(1, now=0.0, lease_ttl_s=TTL, fence=token)  # "q" leased
    stale = "9:old-leader"
    for call in (
        lambda: index.set_caps({"free": 5}, fence=stale),
        lambda: index.requeue(replace(job("q", "t1"), attempt=2), fence=stale),
        lambda: index.requeue_many([job("new", "t3")], fence=stale),
        lambda: index.release("q", fence=stale),
        lambda: index.cancel("l", fence=stale),
        lambda: index.restore_lease(job("x", "t4"), ttl_s=TTL, now=0.0, fence=stale),
        lambda: index.set_generation("42", fence=stale),
        lambda: index.admit(job("fed", "t5"), bound=10, fence=stale),  # a batch feeder's
    ):
        with pytest.raises(NotLeader):
            call()
    assert index.tenant_inflight("t1") == 1 and index.position("l") == 0
    assert set(index.job_ids()) == {"q", "l"} and index.generation() != "42"
    index.set_generation("42", fence=token)
    assert index.generation() == "42"
    assert index.admit(job("fed", "t5"), bound=10, fence=token).accepted


def test_a_deposed_leader_gets_no_lease(index: DispatchIndex) -> None:
    fill(index, job("a"))
    old = index.acquire_leadership("a", ttl_s=0.2, now=time.time())
    assert old is not None
    wait_for(lambda: index.acquire_leadership("b", ttl_s=60, now=time.time()))
    with pytest.raises(NotLeader):
        index.dispatch(1, now=time.time(), lease_ttl_s=TTL, fence=old)
    assert index.inflight() == 0
    assert index.position("a") == 0


# -- rebuilding from SQL: restored leases, the entries, the generation --


def test_restore_lease_takes_a_lease_that_counts_against_the_cap(index: DispatchIndex) -> None:
    fill(index, job("q1", "a", key=1.0))
    assert index.restore_lease(job("r1", "a", key=0.5), ttl_s=50.0, now=0.0) is True
    assert index.tenant_inflight("a") == 1
    assert index.dispatch(10, now=0.0, lease_ttl_s=TTL) == []  # the tenant is at its cap of 1
    assert index.renew("r1", attempt=1, ttl_s=60.0, now=0.0) is True
    assert index.reap(now=59.0) == []
    assert index.reap(now=60.0) == [
        Lease(job_id="r1", tenant="a", tier="free", order_key=0.5, expires_at=60.0)
    ]
    assert ids(index.dispatch(10, now=60.0, lease_ttl_s=TTL)) == ["q1"]


def test_restore_lease_keeps_the_later_expiry_and_leaves_later_attempts(
    index: DispatchIndex,
) -> None:
    later = {"attempt": 2}
    fill(index, job("a", "t1"))
    index.requeue_many([replace(job("b", "t2"), **later),
                        replace(job("d", "t3", not_before=99.0), **later)])
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)  # a until 30
    assert index.restore_lease(job("a", "t1"), ttl_s=20.0, now=0.0) is True
    assert ids(index.reap(now=29.0)) == []
    assert index.restore_lease(job("a", "t1"), ttl_s=40.0, now=0.0) is True
    assert ids(index.reap(now=39.0)) == []
    assert index.restore_lease(job("b", "t2"), ttl_s=40.0, now=0.0) is False
    assert index.restore_lease(job("d", "t3"), ttl_s=40.0, now=0.0) is False
    assert index.position("b") == 0
    assert index.tenant_queued("t3") == 1
    assert ids(index.reap(now=40.0)) == ["a"]
    assert index.inflight() == 0


def test_restore_lease_replaces_an_earlier_attempt_or_a_stale_queued_entry(
    index: DispatchIndex,
) -> None:
    fill(index, job("a", "t1"), job("b", "t2"))
    assert index.restore_lease(job("a", "t1"), ttl_s=10.0, now=0.0) is True  # SQL: in flight
    assert index.position("a") is None and index.tenant_inflight("t1") == 1
    index.dispatch(5, now=0.0, lease_ttl_s=TTL)  # b, attempt 1, until 30
    assert index.restore_lease(replace(job("b", "t2"), attempt=2), ttl_s=5.0, now=0.0) is True
    assert index.renew("b", attempt=1, ttl_s=TTL, now=1.0) is False  # attempt 1 lost it
    assert index.renew("b", attempt=2, ttl_s=TTL, now=1.0) is True
    assert [lease.attempt for lease in index.reap(now=100.0)] == [1, 2]


def test_restore_lease_for_a_new_tenant_files_it_under_its_tier_cap(
    index: DispatchIndex,
) -> None:
    index.set_caps({"free": 1, "paid": 2})
    assert index.restore_lease(job("r", "t", tier="paid"), ttl_s=50.0, now=0.0) is True
    index.requeue(job("q", "t", tier="paid"))
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["q"]  # cap 2, not 1


def test_job_ids_lists_queued_delayed_and_leased(index: DispatchIndex) -> None:
    assert list(index.job_ids()) == []
    fill(index, job("a", "t1"), job("b", "t2"), job("d", "t3", not_before=99.0))
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    index.register_worker("w", slots=1, ttl_s=10.0, now=0.0)
    assert sorted(index.job_ids()) == ["a", "b", "d"]


def test_generation_is_set_once_and_cleared_with_the_index(index: DispatchIndex) -> None:
    assert index.generation() is None
    assert index.mark_generation("g1") is True
    assert index.mark_generation("g2") is False
    assert index.generation() == "g1"
    token = index.acquire_leadership("a", ttl_s=60, now=time.time())
    index.clear()
    assert index.generation() is None
    assert index.leader(now=time.time()) is None
    assert token is not None
    assert index.renew_leadership(token, ttl_s=60, now=time.time()) is False


def test_an_index_an_earlier_version_wrote_is_brought_to_this_layout(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """That layout also kept every queued job in one zset of all tiers, and a tier's delayed
    jobs in the tier's zset. After the upgrade the first is gone, counts and positions are
    as if this version had written it all, and a second call finds nothing to do."""
    index = RedisIndex(redis_client, key_prefix)
    keys = IndexKeys(key_prefix)
    index.set_caps({"free": 2, "paid": 2})
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0, tier="paid"),
         job("d", "t3", key=0.5, tier="paid", not_before=99.0))
    # What the earlier version wrote besides: the queue of every tier, the delayed job in its
    # tier's zset, and no delayed counts.
    redis_client.zadd(f"{key_prefix}queued", {"a": 1.0, "b": 2.0})
    redis_client.zadd(keys.tier("paid"), {"d": 0.5})
    redis_client.delete(keys.tier_delayed)
    assert index.position("b") is None  # wrong until upgraded: the tiers are not named

    assert index.upgrade_layout() is True

    assert not redis_client.exists(f"{key_prefix}queued")
    assert index.tier_depths(["free", "paid"]) == {
        "free": TierDepth(queued=1, oldest_order_key=1.0),
        "paid": TierDepth(queued=2, oldest_order_key=2.0),
    }
    assert (index.position("a"), index.position("b"), index.position("d")) == (0, 1, None)
    assert index.position_at(1.5) == 1
    assert index.upgrade_layout() is False


def _write_tenant_zset_layout(client: redis.Redis, prefix: str, queued: list[Any]) -> None:
    """The layout before tenants' queues were lists: each tenant's queue a zset ``q:<tenant>``,
    tenants filed in ``runnable`` / ``blocked`` under their head job alone, every job with
    meta. ``queued``: (job, tenant, tier, order key) in any order."""
    keys = IndexKeys(prefix)
    heads: dict[str, tuple[float, str]] = {}
    for job_id, tenant, tier, key in queued:
        client.zadd(f"{prefix}q:{tenant}", {job_id: key})
        client.zadd(keys.tier(tier), {job_id: key})
        client.hset(keys.meta, job_id, f'["{tenant}","{tier}","{key!r}","","",1]')
        client.hset(f"{prefix}tenant_tier", tenant, tier)
        client.hsetnx(keys.tier_delayed, tier, 0)
        heads[tenant] = min(heads.get(tenant, (key, job_id)), (key, job_id))
    for key, job_id in heads.values():
        client.zadd(f"{prefix}runnable", {job_id: key})


def test_an_index_whose_tenants_queues_are_sorted_sets_is_brought_to_this_layout(
    redis_client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each tenant's zset becomes its list, merged with one this version started meanwhile;
    the tenants are filed anew and dispatch in order; the old keys go; a second call finds
    nothing to do. Moved in calls of a few jobs each, as a large index is."""
    index = RedisIndex(redis_client, key_prefix)
    index.set_caps({"free": 5, "paid": 5})
    _write_tenant_zset_layout(redis_client, key_prefix, [
        ("c", "t1", "free", 3.0), ("a", "t1", "free", 1.0), ("e", "t2", "paid", 0.5),
        ("f", "t2", "paid", 4.0), ("b", "t3", "free", 2.0),
    ])
    fill(index, job("g", "t1", key=2.5), job("h", "t4", key=0.1))  # this version, meanwhile
    monkeypatch.setattr(redis_upkeep, "UPGRADE_CHUNK", 1)
    assert index.upgrade_layout() is True

    assert not any(redis_client.exists(f"{key_prefix}{name}")
                   for name in ("runnable", "blocked", "q:t1", "q:t2", "q:t3"))
    assert [index.tenant_queued(t) for t in ("t1", "t2", "t3", "t4")] == [3, 2, 1, 1]
    assert [index.position(j) for j in "heabgcf"] == [0, 1, 2, 3, 4, 5, 6]
    assert ids(index.dispatch(10, lease_ttl_s=TTL)) == ["h", "e", "a", "b", "g", "c", "f"]
    assert index.upgrade_layout() is False
