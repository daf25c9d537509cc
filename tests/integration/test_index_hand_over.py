"""The contract of ``hand_over`` and ``put_back``, for every DispatchIndex: a worker's slot
passes straight to the next job (release and lease in one step), and a lease that cannot
start yet goes back to the queue as it was indexed. The twin and Redis pass the same tests,
and a model-based run drives both side by side through these operations among the others."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule, run_state_machine_as_test
from redis.client import PubSub

from jobs.core.histograms import StartFigures
from jobs.index import DispatchIndex, IndexedJob, Lease, NotLeader, RedisIndex
from jobs.index.base import Entry, Finished, FirstRenewal, Renewal
from tests.integration.test_index_contract import BIG, TTL, fill, ids, job
from tests.integration.test_index_stateful import JOB_IDS, IndexPair, jobs, random_step
from tests.services import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def whole(request: pytest.FixtureRequest) -> None:
    """The index a leader has rebuilt: its generation sentinel is set (``set_generation``)."""
    for name in ("index", "redis_index"):
        if name in request.fixturenames:
            request.getfixturevalue(name).set_generation("1")


def lease(job_id: str, tenant: str, key: float, expires_at: float, *, attempt: int = 1,
          start_by: float | None = None) -> Lease:
    return Lease(job_id=job_id, tenant=tenant, tier="free", order_key=key,
                 expires_at=expires_at, attempt=attempt, start_by=start_by)


# -- hand_over: release, then lease the next job --


def test_hand_over_releases_only_the_named_attempt(index: DispatchIndex) -> None:
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    # Another attempt's call: a's lease stays, so the pool of one has no free slot.
    assert index.hand_over("a", attempt=2, lease_ttl_s=TTL, capacity=1, now=1.0) is None
    assert index.entries_of(["a", "b"]) == {
        "a": Entry(job_id="a", attempt=1, leased=True),
        "b": Entry(job_id="b", attempt=1, leased=False),
    }
    assert index.position("b") == 0
    handed = index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=1, now=1.0)
    assert handed == lease("b", "t2", 2.0, 1.0 + TTL)
    assert index.entries_of(["a", "b"]) == {"b": Entry(job_id="b", attempt=1, leased=True)}
    assert index.inflight() == 1 and index.tenant_inflight("t1") == 0


def test_an_index_that_lost_its_data_hands_over_nothing_until_it_is_rebuilt(
    index: DispatchIndex,
) -> None:
    """Without its sentinel, the leases of running jobs may be gone with the rest: a tenant
    whose running jobs lost their leases would look under its cap. The slot is released, and
    no job is leased until a leader has put the leases back (``set_generation``)."""
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0), job("c", "t3", key=3.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    index.set_generation(None)
    assert index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=1, now=1.0) is None
    assert index.inflight() == 0 and index.position("b") == 0
    index.set_generation("2")  # rebuilt
    assert ids(index.dispatch(1, now=1.0, lease_ttl_s=TTL)) == ["b"]
    handed = index.hand_over("b", attempt=1, lease_ttl_s=TTL, capacity=1, now=2.0)
    assert handed == lease("c", "t3", 3.0, 2.0 + TTL)


def test_hand_over_leases_in_dispatch_order_ties_by_job_id(index: DispatchIndex) -> None:
    fill(index, job("x", "t0", key=0.0), job("j3", "t1", key=2.0), job("j2", "t2", key=1.0),
         job("j1", "t3", key=2.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["x"]
    taken, held = [], "x"
    while (nxt := index.hand_over(held, attempt=1, lease_ttl_s=TTL, capacity=1,
                                  now=0.0)) is not None:
        taken.append(nxt.job_id)
        held = nxt.job_id
    assert taken == ["j2", "j1", "j3"]
    assert index.inflight() == 0  # the last hand over released j3 and found nothing


def test_the_slot_a_tenant_frees_may_go_to_its_own_next_job(index: DispatchIndex) -> None:
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0), job("b1", "b", key=3.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a1"]
    # a is at its cap of 1 until a1's release, which the same step makes first.
    handed = index.hand_over("a1", attempt=1, lease_ttl_s=TTL, capacity=1, now=0.0)
    assert handed is not None and handed.job_id == "a2"
    assert index.tenant_inflight("a") == 1 and index.position("b1") == 0


def test_hand_over_skips_a_tenant_at_its_cap_and_keeps_it_blocked(
    index: DispatchIndex,
) -> None:
    fill(index, job("w1", "w", key=0.0), job("a1", "a", key=1.0), job("a2", "a", key=2.0),
         job("b1", "b", key=3.0))
    assert ids(index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["w1", "a1"]
    handed = index.hand_over("w1", attempt=1, lease_ttl_s=TTL, capacity=2, now=0.0)
    assert handed is not None and handed.job_id == "b1"  # a2 is ahead, but a is at its cap
    assert index.position("a2") == 0 and index.tenant_queued("a") == 1
    # Nothing else is runnable: the free slot stays free.
    assert index.hand_over("b1", attempt=1, lease_ttl_s=TTL, capacity=2, now=0.0) is None
    assert index.release("a1", attempt=1) is True  # a was filed blocked: runnable again
    assert ids(index.dispatch(5, now=0.0, lease_ttl_s=TTL)) == ["a2"]


def test_hand_over_honours_tenant_cap_overrides(index: DispatchIndex) -> None:
    index.set_caps({"free": 1}, {"a": 2})
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0), job("a3", "a", key=3.0),
         job("b1", "b", key=4.0), job("c1", "c", key=5.0))
    assert ids(index.dispatch(3, now=0.0, lease_ttl_s=TTL)) == ["a1", "a2", "b1"]
    handed = index.hand_over("b1", attempt=1, lease_ttl_s=TTL, capacity=BIG, now=0.0)
    assert handed is not None and handed.job_id == "c1"  # a holds its 2: a3 waits
    handed = index.hand_over("a1", attempt=1, lease_ttl_s=TTL, capacity=BIG, now=0.0)
    assert handed is not None and handed.job_id == "a3"


def test_hand_over_leases_nothing_when_an_explicit_capacity_is_full(
    index: DispatchIndex,
) -> None:
    index.set_caps({"free": BIG})
    fill(index, *(job(f"j{n}", key=float(n)) for n in range(6)))
    assert ids(index.dispatch(3, now=0.0, lease_ttl_s=TTL)) == ["j0", "j1", "j2"]
    # Three held in a pool of two (it shrank): the release leaves two, no slot is free.
    assert index.hand_over("j0", attempt=1, lease_ttl_s=TTL, capacity=2, now=0.0) is None
    assert index.inflight() == 2 and index.position("j3") == 0
    handed = index.hand_over("j1", attempt=1, lease_ttl_s=TTL, capacity=3, now=0.0)
    assert handed is not None and handed.job_id == "j3"
    assert index.hand_over("j2", attempt=1, lease_ttl_s=TTL, capacity=0, now=0.0) is None
    assert index.inflight() == 1 and index.position("j4") == 0


def test_hand_over_without_a_capacity_counts_the_live_workers_slots(
    index: DispatchIndex,
) -> None:
    index.set_caps({"free": BIG})
    fill(index, *(job(f"j{n}", key=float(n)) for n in range(5)))
    index.register_worker("w1", slots=1, ttl_s=10.0, now=0.0)
    index.register_worker("w2", slots=1, ttl_s=20.0, now=0.0)
    assert ids(index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["j0", "j1"]
    handed = index.hand_over("j0", attempt=1, lease_ttl_s=TTL, now=5.0)  # 2 slots, 1 held
    assert handed is not None and handed.job_id == "j2"
    # w1 has lapsed: one slot, still held by j2 once j1 is released.
    assert index.hand_over("j1", attempt=1, lease_ttl_s=TTL, now=15.0) is None
    handed = index.hand_over("j2", attempt=1, lease_ttl_s=TTL, now=15.0)
    assert handed is not None and handed.job_id == "j3"
    assert index.hand_over("j3", attempt=1, lease_ttl_s=TTL, now=25.0) is None  # no worker
    assert index.inflight() == 0 and index.position("j4") == 0


def test_a_stopping_worker_hands_over_nothing(index: DispatchIndex) -> None:
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0))
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    assert index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=BIG, now=0.0,
                           take_next=False) is None
    assert index.inflight() == 0 and index.entries_of(["a"]) == {}
    assert index.position("b") == 0


def test_hand_over_promotes_due_delayed_jobs(index: DispatchIndex) -> None:
    fill(index, job("x", "t1", key=1.0), job("y", "t2", key=2.0),
         job("d", "t3", key=0.0, not_before=50.0))
    assert ids(index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["x", "y"]
    assert index.hand_over("x", attempt=1, lease_ttl_s=TTL, capacity=BIG, now=49.0) is None
    assert index.position("d") is None and index.tenant_queued("t3") == 1
    handed = index.hand_over("y", attempt=1, lease_ttl_s=TTL, capacity=BIG, now=50.0)
    assert handed == lease("d", "t3", 0.0, 50.0 + TTL)
    assert index.tenant_queued("t3") == 0


def test_the_handed_over_lease_carries_its_attempt_and_start_by(index: DispatchIndex) -> None:
    fill(index, job("x", "t1", key=0.0))
    index.requeue(replace(job("s", "t2", key=1.0, start_by=99.0), attempt=3))
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    handed = index.hand_over("x", attempt=1, lease_ttl_s=7.0, capacity=1, now=10.0)
    assert handed == lease("s", "t2", 1.0, 17.0, attempt=3, start_by=99.0)
    assert index.expire_due(now=100.0) == []  # leased: no longer the sweeper's
    assert index.renew("s", attempt=3, ttl_s=TTL, now=10.0) is True
    assert ids(index.reap(now=10.0 + TTL)) == ["s"]


# -- put_back: a lease goes back to the queue as it was indexed --


def test_put_back_takes_only_the_held_attempt(index: DispatchIndex) -> None:
    index.requeue(replace(job("a", "t1", key=1.0), attempt=2))
    fill(index, job("b", "t2", key=2.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    assert index.put_back("a", attempt=1) is False  # a zombie of attempt 1
    assert index.put_back("b", attempt=1) is False  # queued, not leased
    assert index.put_back("nope", attempt=1) is False
    assert index.entries_of(["a", "b"]) == {
        "a": Entry(job_id="a", attempt=2, leased=True),
        "b": Entry(job_id="b", attempt=1, leased=False),
    }
    assert index.position("b") == 0 and index.inflight() == 1
    assert index.put_back("a", attempt=2) is True
    assert index.entries_of(["a"]) == {"a": Entry(job_id="a", attempt=2, leased=False)}
    assert index.put_back("a", attempt=2) is False  # queued now
    assert index.position("a") == 0 and index.position("b") == 1
    (again,) = index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    assert (again.job_id, again.attempt) == ("a", 2)


def test_put_back_delays_the_entry_until_not_before_keeping_key_and_deadline(
    index: DispatchIndex,
) -> None:
    fill(index, job("a", "t1", key=1.0, start_by=100.0), job("b", "t2", key=2.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    assert index.put_back("a", attempt=1, not_before=10.0) is True
    assert index.inflight() == 0 and index.tenant_inflight("t1") == 0
    assert index.tenant_queued("t1") == 1
    depth = index.tier_depths(["free"])["free"]
    assert (depth.queued, depth.oldest_order_key) == (2, 2.0)  # a waits, but not in line
    assert index.position("a") is None and index.position("b") == 0  # delayed: not in line
    assert ids(index.dispatch(10, now=9.9, lease_ttl_s=TTL)) == ["b"]
    assert index.dispatch(10, now=9.9, lease_ttl_s=TTL) == []
    assert index.dispatch(10, now=10.0, lease_ttl_s=TTL) == [
        lease("a", "t1", 1.0, 10.0 + TTL, start_by=100.0)]
    assert index.tenant_queued("t1") == 0


def test_put_back_without_not_before_is_due_at_once_in_its_place(
    index: DispatchIndex,
) -> None:
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0), job("b1", "b", key=1.5),
         job("c1", "c", key=3.0))
    assert ids(index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["a1", "b1"]
    assert index.put_back("a1", attempt=1) is True
    assert [index.position(j) for j in ("a1", "a2", "c1")] == [0, 1, 2]
    assert (index.tenant_queued("a"), index.tenant_inflight("a")) == (2, 0)
    # a is under its cap again, with a1 at its head; a2 waits behind it (cap 1).
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["a1", "c1"]
    assert index.position("a2") == 0


def test_a_delayed_put_back_frees_its_tenants_cap_meanwhile(index: DispatchIndex) -> None:
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a1"]
    assert index.put_back("a1", attempt=1, not_before=5.0) is True
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["a2"]
    assert index.dispatch(10, now=5.0, lease_ttl_s=TTL) == []  # a1 due, a at its cap
    assert index.position("a1") == 0
    assert index.release("a2", attempt=1) is True  # a was blocked under a1
    assert ids(index.dispatch(10, now=5.0, lease_ttl_s=TTL)) == ["a1"]


def test_a_put_back_entry_still_expires_at_its_start_by(index: DispatchIndex) -> None:
    fill(index, job("a", "t1", key=1.0, start_by=20.0))
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    assert index.expire_due(now=30.0) == []  # leased
    assert index.put_back("a", attempt=1, not_before=30.0) is True
    assert index.expire_due(now=19.9) == []
    assert index.expire_due(now=20.0) == [
        IndexedJob(job_id="a", tenant="t1", tier="free", order_key=1.0, start_by=20.0,
                   not_before=30.0)]
    assert index.tenant_queued("t1") == 0 and index.entries_of(["a"]) == {}


def test_put_back_is_fenced(index: DispatchIndex) -> None:
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0))
    assert ids(index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["a", "b"]
    with pytest.raises(NotLeader):  # nobody leads
        index.put_back("a", attempt=1, fence="1:x")
    token = index.acquire_leadership("d", ttl_s=60, now=time.time())
    assert token is not None
    with pytest.raises(NotLeader):
        index.put_back("a", attempt=1, not_before=5.0, fence="9:x")
    assert index.inflight() == 2 and index.tenant_queued("t1") == 0  # nothing changed
    assert index.put_back("a", attempt=1, fence=token) is True
    assert index.put_back("b", attempt=1) is True  # unfenced: a worker's
    assert index.resign_leadership(token, now=time.time())
    fill(index, job("c", "t3", key=3.0))
    index.dispatch(10, now=0.0, lease_ttl_s=TTL)
    with pytest.raises(NotLeader):  # a deposed leader's late write
        index.put_back("a", attempt=1, fence=token)
    assert index.inflight() == 3


# -- Redis: the doorbell rings when the slot is left for the dispatcher --


def test_a_hand_over_that_leases_nothing_rings_the_doorbell(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    index = RedisIndex(redis_client, key_prefix)
    index.set_generation("1")
    bell = f"{key_prefix}wake"
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0), job("c", "t3", key=3.0))
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    assert index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=1, now=0.0) is not None
    assert redis_client.llen(bell) == 0  # the slot went on: nothing for the dispatcher
    assert index.hand_over("b", attempt=1, lease_ttl_s=TTL, capacity=0, now=0.0) is None
    assert redis_client.lrange(bell, 0, -1) == [b"1"]
    redis_client.delete(bell)
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    assert index.hand_over("c", attempt=1, lease_ttl_s=TTL, capacity=1, now=0.0,
                           take_next=False) is None
    assert redis_client.lrange(bell, 0, -1) == [b"1"]


# -- hand_over(keep=True): the ending lease stays until its commit, its slot passed on --


def test_a_kept_lease_stays_until_released_and_its_slot_passes_on(
    index: DispatchIndex,
) -> None:
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0), job("c", "t3", key=3.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    # A pool of one, full: a's slot is the one passed on, and a's lease is still held.
    handed = index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=1, now=1.0, keep=True)
    assert handed == lease("b", "t2", 2.0, 1.0 + TTL)
    assert index.entries_of(["a", "b"]) == {"a": Entry(job_id="a", attempt=1, leased=True),
                                            "b": Entry(job_id="b", attempt=1, leased=True)}
    assert index.inflight() == 2
    # Both held: the pool has no free slot for anything else until a's release.
    assert index.dispatch(5, now=1.0, lease_ttl_s=TTL, capacity=1) == []
    assert index.reap(now=1.0 + TTL / 2) == []  # a's lease keeps its expiry
    index.release("a", attempt=1)
    assert index.inflight() == 1 and index.position("c") == 0


def test_a_kept_lease_counts_for_its_tenant_again_after_the_choice(
    index: DispatchIndex,
) -> None:
    index.register_worker("w@host", slots=BIG, ttl_s=1e6, now=0.0)  # live slots
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0), job("a3", "a", key=3.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a1"]
    # a's cap is 1: a1's slot passes to a2 (a1 not counted for the choice)...
    handed = index.hand_over("a1", attempt=1, lease_ttl_s=TTL, capacity=BIG, now=0.0,
                             keep=True)
    assert handed is not None and handed.job_id == "a2"
    # ... but a holds two leases now: a3 waits for a release, not for a free slot.
    assert index.tenant_inflight("a") == 2
    assert index.dispatch(5, now=0.0, lease_ttl_s=TTL, capacity=BIG) == []
    index.release("a1", attempt=1)
    assert index.dispatch(5, now=0.0, lease_ttl_s=TTL, capacity=BIG) == []  # a2 holds the cap
    index.release("a2", attempt=1)
    assert ids(index.dispatch(5, now=0.0, lease_ttl_s=TTL, capacity=BIG)) == ["a3"]


def test_keeping_a_lease_that_is_gone_passes_on_no_slot(index: DispatchIndex) -> None:
    index.register_worker("w@host", slots=BIG, ttl_s=1e6, now=0.0)  # live slots
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    assert ids(index.reap(now=TTL + 1)) == ["a"]  # reaped: its slot was given back already
    assert ids(index.dispatch(1, now=TTL + 1, lease_ttl_s=TTL, capacity=1)) == ["b"]
    assert index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=1, now=TTL + 1,
                           keep=True) is None
    assert index.inflight() == 1


# -- the twin and Redis agree, with hand_over and put_back among the other operations --


class HandOverPair(IndexPair):
    """``IndexPair``'s machine, with later attempts, hand-overs and put-backs."""

    @rule(job=jobs, attempt=st.integers(1, 3))
    def requeue_attempt(self, job: IndexedJob, attempt: int) -> None:
        entry = replace(job, attempt=attempt)
        self.both(lambda index: index.requeue(entry))

    @rule(
        data=st.data(),
        attempt=st.sampled_from([1, 1, 1, 2, 3]),
        capacity=st.none() | st.integers(0, 6),
        ttl=st.sampled_from([1.0, 5.0, 30.0]),
        take_next=st.booleans() | st.just(True),
        any_id=st.booleans(),
        keep=st.booleans(),
    )
    def hand_over(self, data: st.DataObject, attempt: int, capacity: int | None, ttl: float,
                  take_next: bool, any_id: bool, keep: bool) -> None:
        job_id = data.draw(st.sampled_from(JOB_IDS if any_id or not self.leased else self.leased))
        handed = self.both(lambda index: index.hand_over(
            job_id, attempt=attempt, lease_ttl_s=ttl, capacity=capacity, now=self.now,
            take_next=take_next, keep=keep))
        if handed is not None:
            self.leased.append(handed.job_id)

    @rule(
        data=st.data(),
        attempt=st.sampled_from([1, 1, 1, 2, 3]),
        delay=st.none() | st.sampled_from([0.0, 0.5, 5.0]),
        any_id=st.booleans(),
    )
    def put_back(self, data: st.DataObject, attempt: int, delay: float | None,
                 any_id: bool) -> None:
        job_id = data.draw(st.sampled_from(JOB_IDS if any_id or not self.leased else self.leased))
        not_before = None if delay is None else self.now + delay
        self.both(lambda index: index.put_back(job_id, attempt=attempt, not_before=not_before))

    @rule(data=st.data(), attempt=st.sampled_from([1, 1, 2]))
    def renew_releasing(self, data: st.DataObject, attempt: int) -> None:
        pool = self.leased or JOB_IDS
        renewed, released = data.draw(st.sampled_from(pool)), data.draw(st.sampled_from(pool))
        ending = Finished(job_id=released, attempt=attempt, outcome="succeeded")
        self.both(lambda index: index.renew_checked(renewed, attempt=1, ttl_s=5.0, now=self.now,
                                                   release=ending))

    @invariant()
    def same_view(self) -> None:
        super().same_view()
        self.both(lambda index: index.entries_of(JOB_IDS))
        self.both(lambda index: index.inflight_by_tenant())


@pytest.mark.timeout(600)
def test_memory_twin_matches_redis_through_hand_overs(redis_server: RedisServer) -> None:
    HandOverPair.server = redis_server
    run_state_machine_as_test(
        HandOverPair,
        settings=settings(max_examples=80, stateful_step_count=40, deadline=None,
                          database=None),
    )


def hand_over_step(pair: HandOverPair, rng: random.Random) -> None:
    """A hand over or a put back of a lease dispatched earlier (now and then any id)."""
    job_id = rng.choice(pair.leased if pair.leased and rng.random() < 0.9 else JOB_IDS)
    attempt = rng.choice([1, 1, 1, 2])
    if rng.random() < 0.6:
        capacity = rng.choice([None, 2, 4, 6, rng.randint(0, 6)])
        ttl, take_next = rng.choice([1.0, 30.0]), rng.random() < 0.9
        keep = rng.random() < 0.5
        handed = pair.both(lambda index: index.hand_over(
            job_id, attempt=attempt, lease_ttl_s=ttl, capacity=capacity, now=pair.now,
            take_next=take_next, keep=keep))
        if handed is not None:
            pair.leased.append(handed.job_id)
    else:
        not_before = rng.choice([None, pair.now, pair.now + rng.choice([0.5, 5.0])])
        pair.both(lambda index: index.put_back(job_id, attempt=attempt, not_before=not_before))


def heartbeat_step(pair: HandOverPair, rng: random.Random) -> None:
    worker, slots = rng.choice(["w1", "w2"]), rng.randint(0, 4)
    until = pair.now + rng.choice([5.0, 20.0])
    pair.both(lambda index: index.register_worker(worker, slots=slots, ttl_s=until, now=0.0))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", range(3))
def test_long_walks_with_hand_overs_match(redis_server: RedisServer, seed: int) -> None:
    HandOverPair.server = redis_server
    pair = HandOverPair()
    rng = random.Random(1000 + seed)
    try:
        for step in range(800):
            if step % 50 == 0:  # live workers come and go: hand_over without a capacity
                heartbeat_step(pair, rng)
            if rng.random() < 0.35:
                hand_over_step(pair, rng)
            else:
                random_step(pair, rng)
            pair.same_view()
    finally:
        pair.teardown()


# -- renew_checked(release=...): the handing attempt's lease goes with the first renewal --


def test_the_first_renewal_releases_the_lease_that_handed_the_job_over(
    index: DispatchIndex,
) -> None:
    index.register_worker("w@host", slots=BIG, ttl_s=1e6, now=0.0)  # live slots
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0), job("c", "t3", key=3.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    handed = index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=1, now=1.0, keep=True)
    assert handed is not None and handed.job_id == "b"
    assert index.inflight() == 2
    # A release naming another attempt of a changes nothing of it; b is renewed all the same.
    wrong = Finished(job_id="a", attempt=2, outcome="succeeded")
    assert index.renew_checked("b", attempt=1, ttl_s=TTL, now=2.0, release=wrong) \
        is Renewal.HELD
    assert index.inflight() == 2
    done = Finished(job_id="a", attempt=1, outcome="succeeded")
    assert index.renew_checked("b", attempt=1, ttl_s=TTL, now=2.0, release=done) \
        is Renewal.HELD
    assert index.entries_of(["a", "b"]) == {"b": Entry(job_id="b", attempt=1, leased=True)}
    assert ids(index.dispatch(5, now=2.0, lease_ttl_s=TTL, capacity=2)) == ["c"]


def a_handed_to_b(client: redis.Redis, prefix: str) -> RedisIndex:
    """a dispatched, then its slot handed to b, a's lease kept."""
    index = RedisIndex(client, prefix)
    index.set_generation("1")
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    assert index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=1, now=1.0, keep=True)
    return index


@contextlib.contextmanager
def changes(client: redis.Redis, prefix: str) -> Iterator[PubSub]:
    """Subscribed to the index's ``changed`` channel meanwhile."""
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(f"{prefix}changed")
    try:
        yield pubsub
    finally:
        pubsub.close()


def first_message(pubsub: PubSub) -> bytes | None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message is not None:
            data: bytes = message["data"]
            return data
    return None


def test_the_first_renewal_announces_the_ended_job_and_the_started_one_in_one_message(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    index = a_handed_to_b(redis_client, key_prefix)
    with changes(redis_client, key_prefix) as pubsub:
        done = Finished(job_id="a", attempt=1, outcome="succeeded")
        assert index.renew_checked("b", attempt=1, ttl_s=TTL, now=2.0, announce=True,
                                   release=done) is Renewal.HELD
        assert first_message(pubsub) == b"a b"
        assert pubsub.get_message(timeout=0.2) is None  # and no other


# -- hand_over(first=...): a first renewal not made yet goes with the hand-over --------------


def test_a_hand_over_makes_the_first_renewal_it_is_given_first(index: DispatchIndex) -> None:
    """a hands its slot to b, keeping its lease; b's first renewal, which releases a, rides
    on b's own hand-over: a's lease is gone before b's slot is passed on, so c (a's tenant,
    at its cap of one while a's lease counts) is leased for it, and b's lease is kept for
    its own ending."""
    fill(index, job("a", "t1", key=1.0), job("b", "t2", key=2.0), job("c", "t1", key=3.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
    handed = index.hand_over("a", attempt=1, lease_ttl_s=TTL, capacity=1, now=1.0, keep=True)
    assert handed is not None and handed.job_id == "b"
    first = FirstRenewal(ttl_s=TTL, start=None,
                         release=Finished(job_id="a", attempt=1, outcome="succeeded"))
    nxt = index.hand_over("b", attempt=1, lease_ttl_s=TTL, capacity=1, now=2.0, keep=True,
                          first=first)
    assert nxt is not None and nxt.job_id == "c"
    assert index.entries_of(["a", "b", "c"]) == {
        "b": Entry(job_id="b", attempt=1, leased=True),
        "c": Entry(job_id="c", attempt=1, leased=True)}
    assert index.inflight() == 2


def test_a_hand_over_with_a_first_renewal_announces_both_jobs_then_counts_the_start(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    index = a_handed_to_b(redis_client, key_prefix)
    with changes(redis_client, key_prefix) as pubsub:
        first = FirstRenewal(ttl_s=TTL, start=StartFigures(wait_s=1.0, dispatch_s=None),
                             release=Finished(job_id="a", attempt=1, outcome="succeeded"))
        assert index.hand_over("b", attempt=1, lease_ttl_s=TTL, capacity=1, now=2.0,
                               keep=True, first=first) is None
        assert first_message(pubsub) == b"a b"
    counts = redis_client.hgetall(f"{key_prefix}counters:jobs")
    assert counts[b"running"] == b"1" and counts[b"succeeded"] == b"1"
    assert index.entries_of(["a", "b"]) == {"b": Entry(job_id="b", attempt=1, leased=True)}
