"""The contract of ``offer``: a submit's step after its commit. A free slot takes the best
runnable job at once (its message pushed to its tier's queue by the index, as the broker's
client would write it); no free slot, nothing happens; a free slot and nothing to lease (or
nothing to push with), the dispatcher's doorbell rings. Pushing needs a broker that is the
index's own Redis, so the twin, which has none, takes ``push=None`` only, as Redis does."""

from __future__ import annotations

import json

import pytest
import redis

from jobs.index import DispatchIndex, RedisIndex
from jobs.index.base import Finished, Renewal, TierPush, TierQueue
from jobs.index.keys import IndexKeys
from tests.integration.test_index_contract import BIG, TTL, fill, ids, job

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def whole(request: pytest.FixtureRequest) -> None:
    """The index a leader has rebuilt (its generation sentinel is set, ``set_generation``),
    with a live worker whose slots the capacities passed cut to nothing."""
    for name in ("index", "redis_index"):
        if name in request.fixturenames:
            index = request.getfixturevalue(name)
            index.set_generation("1")
            index.register_worker("w@host", slots=BIG, ttl_s=LIVE_S, now=0.0)


# Registered at 0.0, live for every ``now`` these tests pass.
LIVE_S = 1e6

ENVELOPE = json.dumps({
    "body": {"callbacks": None}, "content-type": "application/json",
    "headers": {"task": "tierq.run_job", "id": "", "root_id": "", "argsrepr": ""},
    "properties": {"correlation_id": "", "delivery_tag": "",
                   "delivery_info": {"exchange": "", "routing_key": "tier.first"}},
})


@pytest.fixture
def redis_index(redis_client: redis.Redis, key_prefix: str) -> RedisIndex:
    return RedisIndex(redis_client, key_prefix)


def pushes(prefix: str, tiers: tuple[str, ...] = ("free", "premium")) -> TierPush:
    return TierPush(envelope=ENVELOPE, queues=tuple(
        TierQueue(tier=tier, name=f"tier.{tier}", key=f"{prefix}tier.{tier}")
        for tier in tiers))


def doorbell(client: redis.Redis, prefix: str) -> list[bytes]:
    rung: list[bytes] = client.lrange(IndexKeys(prefix).doorbell, 0, -1)  # type: ignore[assignment]
    return rung


def test_without_a_push_an_offer_leases_nothing(index: DispatchIndex) -> None:
    fill(index, job("a", key=1.0))
    assert index.offer(lease_ttl_s=TTL, push=None, capacity=BIG, now=0.0) is None
    assert index.inflight() == 0 and index.position("a") == 0


def test_a_free_slot_takes_the_best_runnable_job_and_its_message_is_pushed(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    fill(redis_index, job("late", "t1", key=5.0), job("first", "t2", key=1.0))
    lease = redis_index.offer(lease_ttl_s=TTL, push=pushes(key_prefix), capacity=2, now=10.0)
    assert lease is not None and (lease.job_id, lease.attempt) == ("first", 1)
    assert lease.expires_at == 10.0 + TTL
    (raw,) = redis_client.lrange(f"{key_prefix}tier.free", 0, -1)  # type: ignore[misc]
    message = json.loads(raw)
    args, kwargs, embed = json.loads(message["body"]) if isinstance(message["body"], str) \
        else message["body"]
    assert (args, kwargs, embed) == (["first", 1, 10.0], {}, {"callbacks": None})
    headers, properties = message["headers"], message["properties"]
    assert headers["id"] == headers["root_id"] == properties["correlation_id"]
    assert headers["id"].startswith("first.1.")
    assert properties["delivery_info"]["routing_key"] == "tier.free"
    assert doorbell(redis_client, key_prefix) == []  # no dispatcher round was needed


def test_a_job_goes_to_its_own_tiers_queue(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    fill(redis_index, job("p", "t1", key=1.0, tier="premium"))
    assert redis_index.offer(lease_ttl_s=TTL, push=pushes(key_prefix), capacity=1,
                             now=0.0) is not None
    assert redis_client.llen(f"{key_prefix}tier.premium") == 1
    assert redis_client.llen(f"{key_prefix}tier.free") == 0


def test_no_free_slot_no_lease_and_no_ring(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    fill(redis_index, job("a", "t1", key=1.0), job("b", "t2", key=2.0))
    assert ids(redis_index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    assert redis_index.offer(lease_ttl_s=TTL, push=pushes(key_prefix), capacity=1,
                             now=0.0) is None
    assert redis_index.position("b") == 0 and redis_index.inflight() == 1
    assert doorbell(redis_client, key_prefix) == []  # the next slot to free takes b itself
    assert redis_client.llen(f"{key_prefix}tier.free") == 0


def test_a_free_slot_and_nothing_runnable_rings_the_dispatcher(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    fill(redis_index, job("a1", "a", key=1.0), job("a2", "a", key=2.0))
    assert ids(redis_index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a1"]  # a at its cap
    assert redis_index.offer(lease_ttl_s=TTL, push=pushes(key_prefix), capacity=BIG,
                             now=0.0) is None
    assert redis_index.position("a2") == 0
    assert doorbell(redis_client, key_prefix) == [b"1"]


def test_an_index_that_lost_its_data_offers_nothing_and_rings_the_dispatcher(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    """The leases of running jobs may be gone with the rest: only the leader, once its
    rebuild has put them back, leases again."""
    fill(redis_index, job("a", key=1.0))
    redis_index.set_generation(None)
    assert redis_index.offer(lease_ttl_s=TTL, push=pushes(key_prefix), capacity=BIG,
                             now=0.0) is None
    assert redis_index.position("a") == 0
    assert doorbell(redis_client, key_prefix) == [b"1"]
    redis_index.set_generation("2")
    offered = redis_index.offer(lease_ttl_s=TTL, push=pushes(key_prefix), capacity=BIG, now=0.0)
    assert offered is not None and offered.job_id == "a"


def test_without_a_push_a_free_slot_rings_the_dispatcher(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    fill(redis_index, job("a", key=1.0))
    assert redis_index.offer(lease_ttl_s=TTL, push=None, capacity=BIG, now=0.0) is None
    assert doorbell(redis_client, key_prefix) == [b"1"]


def test_a_job_whose_tier_has_no_queue_goes_back_for_the_dispatcher(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    fill(redis_index, job("p", "t1", key=1.0, tier="premium"))
    push = pushes(key_prefix, tiers=("free",))
    assert redis_index.offer(lease_ttl_s=TTL, push=push, capacity=1, now=0.0) is None
    assert redis_index.inflight() == 0 and redis_index.position("p") == 0
    assert doorbell(redis_client, key_prefix) == [b"1"]


def test_the_workers_push_is_read_back_as_written(index: DispatchIndex) -> None:
    assert index.tier_push() is None
    push = pushes("{x}:")
    index.set_tier_push(push)
    assert index.tier_push() == push
    assert push.covers(["free"]) and not push.covers(["free", "gold"])


def test_a_lease_kept_while_ending_holds_no_slot_of_the_pool(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    """A slot that passed itself on keeps its ending's lease until the next job's first
    renewal; meanwhile another slot that frees finds the pool's slot count right (the kept
    lease's slot is the next job's) and takes the next job too."""
    fill(redis_index, *(job(f"j{n}", f"t{n}", key=float(n)) for n in range(4)))
    assert ids(redis_index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["j0", "j1"]
    handed = redis_index.hand_over("j0", attempt=1, lease_ttl_s=TTL, capacity=2, now=0.0,
                                   keep=True)
    assert handed is not None and handed.job_id == "j2"  # j0's lease still held
    handed = redis_index.hand_over("j1", attempt=1, lease_ttl_s=TTL, capacity=2, now=0.0,
                                   keep=True)
    assert handed is not None and handed.job_id == "j3"
    assert redis_index.inflight() == 4  # two kept, two running: the pool of two is full
    assert redis_index.offer(lease_ttl_s=TTL, push=pushes(key_prefix), capacity=2,
                             now=0.0) is None


def test_a_late_release_that_frees_its_tenants_cap_for_a_waiting_job_rings_the_dispatcher(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    """A kept lease still counts against its tenant's cap: a slot that frees meanwhile may
    find only that tenant's job waiting, and take nothing. The late release that frees the
    cap, with a slot free, rings the dispatcher to fill it."""
    redis_index.set_caps({"free": 1}, {"a": 2})
    fill(redis_index, job("a1", "a", key=1.0), job("b1", "b", key=2.0),
         job("a2", "a", key=3.0), job("a3", "a", key=4.0))
    assert ids(redis_index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["a1", "b1"]
    handed = redis_index.hand_over("a1", attempt=1, lease_ttl_s=TTL, capacity=2, now=0.0,
                                   keep=True)
    assert handed is not None and handed.job_id == "a2"  # a holds a1 (kept) and a2: its cap
    assert redis_index.hand_over("b1", attempt=1, lease_ttl_s=TTL, capacity=2, now=0.0,
                                 keep=True) is None  # a3 waits on a's cap
    redis_index.release("b1", attempt=1, ring_if_runnable=True)
    assert doorbell(redis_client, key_prefix) == []  # nothing runnable yet
    done = Finished(job_id="a1", attempt=1, outcome="succeeded", capacity=2)
    assert redis_index.renew_checked("a2", attempt=1, ttl_s=TTL, now=1.0, release=done) \
        is Renewal.HELD
    assert doorbell(redis_client, key_prefix) == [b"1"]  # a3 runnable, b1's slot free
    assert ids(redis_index.dispatch(5, now=1.0, lease_ttl_s=TTL, capacity=2)) == ["a3"]


def test_a_late_release_with_nothing_waiting_rings_nobody(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    fill(redis_index, job("a", "t1", key=1.0), job("b", "t2", key=2.0))
    assert ids(redis_index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    assert redis_index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=1, now=0.0,
                                 keep=True) is not None
    done = Finished(job_id="a", attempt=1, outcome="succeeded", capacity=1)
    assert redis_index.renew_checked("b", attempt=1, ttl_s=TTL, now=1.0, release=done) \
        is Renewal.HELD
    assert doorbell(redis_client, key_prefix) == []


def test_a_release_rings_if_runnable_only_while_a_job_waits(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    """A slot that tried to pass itself on and took nothing: its release rings only when a
    job is runnable all the same (the pool was full of leases kept for a moment)."""
    fill(redis_index, job("a", "t1", key=1.0), job("b", "t2", key=2.0))
    assert ids(redis_index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["a", "b"]
    redis_index.release("a", attempt=1, ring_if_runnable=True)
    assert doorbell(redis_client, key_prefix) == []  # nothing waits
    fill(redis_index, job("c", "t3", key=3.0))
    redis_index.release("b", attempt=1, ring_if_runnable=True)
    assert doorbell(redis_client, key_prefix) == [b"1"]  # c waits for the slot b frees


def test_a_pool_routed_by_kind_offers_nothing_and_rings_the_dispatcher(
    redis_index: RedisIndex, redis_client: redis.Redis, key_prefix: str,
) -> None:
    """The index knows no job's kind: while not every live worker runs every kind, only the
    dispatcher, which reads the kinds, leases (``jobs.dispatch.routing``)."""
    fill(redis_index, job("a", key=1.0))
    redis_index.register_worker("w@host", slots=BIG, ttl_s=LIVE_S, now=0.0, kinds=["echo"])
    redis_index.register_worker("v@host", slots=BIG, ttl_s=LIVE_S, now=0.0, kinds=["other"])
    assert redis_index.offer(lease_ttl_s=TTL, push=pushes(key_prefix), capacity=BIG,
                             now=0.0) is None
    assert redis_index.position("a") == 0 and redis_index.inflight() == 0
    assert doorbell(redis_client, key_prefix) == [b"1"]
