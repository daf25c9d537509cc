"""One contract for every DispatchIndex: the in-memory twin and Redis pass the same tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import pytest
import redis

from jobs.dispatch.upkeep import lease_entry, retry_soon
from jobs.index import (
    Admitted,
    DispatchIndex,
    IndexedJob,
    Lease,
    LiveWorker,
    MemoryIndex,
    RedisIndex,
    Renewal,
    TierDepth,
    redis_index,
)

pytestmark = pytest.mark.integration

BIG = 1_000_000
TTL = 30.0


def job(job_id: str, tenant: str = "t1", key: float = 0.0, **extra: Any) -> IndexedJob:
    fields: dict[str, Any] = {"tier": "free", **extra}
    return IndexedJob(job_id=job_id, tenant=tenant, order_key=key, **fields)


def ids(leases: list[Lease]) -> list[str]:
    return [lease.job_id for lease in leases]


def fill(index: DispatchIndex, *jobs: IndexedJob) -> None:
    for each in jobs:
        assert index.admit(each, bound=BIG).accepted


# -- admission --


def test_admit_within_bound_counts_and_positions(index: DispatchIndex) -> None:
    first = index.admit(job("b", key=5.0), bound=3)
    second = index.admit(job("a", "t2", key=1.0), bound=3)
    assert first == Admitted(accepted=True, tier_queued=1, tenant_queued=1, position=0)
    assert second == Admitted(accepted=True, tier_queued=2, tenant_queued=1, position=0)
    assert index.position("b") == 1
    assert index.position("a") == 0
    assert index.tenant_queued("t1") == 1


def test_refused_at_bound_leaves_nothing_behind(index: DispatchIndex) -> None:
    fill(index, job("a", key=1.0), job("c", "t2", key=3.0))
    before = index.tier_depths(["free"])
    refused = index.admit(job("b", "t3", key=2.0), bound=2)
    assert refused == Admitted(
        accepted=False, tier_queued=2, tenant_queued=0, position=1, reason="capacity"
    )
    assert index.tier_depths(["free"]) == before
    assert index.position("b") is None
    assert index.position("c") == 1
    assert index.tenant_queued("t3") == 0
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["a", "c"]


def test_refused_position_breaks_ties_by_job_id(index: DispatchIndex) -> None:
    fill(index, job("a", key=1.0), job("c", "t2", key=1.0), job("d", "t3", key=0.5))
    refused = index.admit(job("b", "t4", key=1.0), bound=3)
    assert not refused.accepted
    assert refused.position == 2  # d (smaller key), a (same key, smaller id)


def test_tenant_quota_refusal_and_capacity_first(index: DispatchIndex) -> None:
    fill(index, job("a"), job("b"))
    quota = index.admit(job("c"), bound=10, tenant_quota=2)
    assert quota.reason == "tenant_limit"
    assert not quota.accepted
    assert quota.tenant_queued == 2
    both = index.admit(job("c"), bound=2, tenant_quota=2)
    assert both.reason == "capacity"
    other = index.admit(job("d", "t2"), bound=10, tenant_quota=2)
    assert other.accepted
    assert index.tenant_queued("t1") == 2


def test_a_job_that_would_have_too_many_ahead_is_refused_for_its_deadline(
    index: DispatchIndex,
) -> None:
    fill(index, job("a", key=1.0), job("b", "t2", key=2.0), job("c", "t3", key=3.0))
    late = index.admit(job("d", "t4", key=2.5), bound=10, max_position=1)
    assert late == Admitted(
        accepted=False, tier_queued=3, tenant_queued=0, position=2, reason="deadline"
    )
    assert index.position("d") is None and index.tier_depths(["free"])["free"].queued == 3
    assert index.admit(job("d", "t4", key=2.5), bound=10, max_position=2).position == 2
    early = index.admit(job("e", "t5", key=0.5), bound=10, max_position=0)
    assert early.accepted and early.position == 0
    # The bound and the quota are checked first.
    assert index.admit(job("f", key=9.0), bound=5, max_position=-1).reason == "capacity"
    assert index.admit(job("f", key=9.0), bound=10, tenant_quota=1,
                       max_position=-1).reason == "tenant_limit"


def test_position_at_counts_queued_jobs_with_a_key_at_or_below(index: DispatchIndex) -> None:
    assert index.position_at(5.0) == 0
    fill(index, job("a", key=1.0), job("b", "t2", key=2.0), job("c", "t3", key=3.0),
         job("z", "t4", key=0.0, not_before=100.0))  # delayed: not positioned
    assert [index.position_at(k) for k in (0.5, 1.0, 2.5, 9.0)] == [0, 1, 2, 3]


def test_duplicate_admit_changes_nothing(index: DispatchIndex) -> None:
    fill(index, job("x", key=1.0), job("a", "t2", key=0.0))
    again = index.admit(job("x", key=9.0), bound=1)
    assert again == Admitted(
        accepted=True, tier_queued=2, tenant_queued=1, position=1, duplicate=True
    )
    assert index.tier_depths(["free"])["free"] == TierDepth(queued=2, oldest_order_key=0.0)
    leased = index.dispatch(2, now=0.0, lease_ttl_s=TTL)
    assert [lease.order_key for lease in leased] == [0.0, 1.0]
    assert index.admit(job("x"), bound=BIG).duplicate


# -- dispatch order and caps --


def test_dispatch_by_order_key_across_tenants_ties_by_job_id(index: DispatchIndex) -> None:
    fill(
        index,
        job("j3", "t1", key=2.0), job("j2", "t2", key=1.0), job("j1", "t3", key=2.0),
        job("j0", "t4", key=3.0),
    )
    leases = index.dispatch(10, now=100.0, lease_ttl_s=TTL)
    assert ids(leases) == ["j2", "j1", "j3", "j0"]
    assert leases[0] == Lease(
        job_id="j2", tenant="t2", tier="free", order_key=1.0, expires_at=130.0
    )
    assert index.inflight() == 4
    assert index.tier_depths(["free"])["free"] == TierDepth(queued=0, oldest_order_key=None)


def test_a_tenants_queue_takes_a_late_job_in_its_place_at_any_distance(
    index: DispatchIndex,
) -> None:
    """A tenant's queue of 200 in order, then jobs whose keys fall before its head, in the
    middle, and 1 to 5 places from its tail: a list is filled from the head (LINSERT) or from
    the tail (the entries behind taken off and put back) by how near the tail the place is;
    either way the tenant's jobs come out in key order."""
    index.set_caps({"free": BIG})
    fill(index, *(job(f"q{i:03d}", key=float(10 * i)) for i in range(200)))
    late = [-5.0, 55.0, 995.0, 1955.0, 1965.0, 1975.0, 1985.0, 1989.0, 1991.0, 1995.0]
    fill(index, *(job(f"late{k:04.0f}", key=k) for k in late))
    leases = index.dispatch(300, now=0.0, lease_ttl_s=TTL)
    keys = [lease.order_key for lease in leases]
    assert len(leases) == 210
    assert keys == sorted(keys)
    assert len(set(ids(leases))) == 210


def test_cap_defaults_to_one(index: DispatchIndex) -> None:
    fill(index, job("a", key=1.0), job("b", key=2.0))
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["a"]
    assert index.tenant_inflight("t1") == 1
    assert index.tenant_queued("t1") == 1


def test_capped_tenant_keeps_its_place(index: DispatchIndex) -> None:
    fill(
        index,
        job("a1", "a", key=1.0), job("a2", "a", key=2.0),
        job("b3", "b", key=3.0), job("b4", "b", key=4.0),
    )
    assert ids(index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["a1", "b3"]
    assert index.dispatch(5, now=0.0, lease_ttl_s=TTL) == []  # both at their cap
    assert index.release("b3") is True  # blocked with b4 queued: runnable again
    assert index.release("a1") is True
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a2"]
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["b4"]


def test_tenant_at_cap_is_skipped_not_counted(index: DispatchIndex) -> None:
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0))
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a1"]
    fill(index, job("b1", "b", key=5.0), job("c1", "c", key=6.0))
    assert ids(index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["b1", "c1"]
    assert index.position("a2") == 0


def test_set_caps_raising_a_cap_unblocks(index: DispatchIndex) -> None:
    fill(index, *(job(f"a{i}", "a", key=float(i)) for i in range(4)))
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["a0"]
    index.set_caps({"free": 3})
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["a1", "a2"]
    index.set_caps({"free": 3}, {"a": 4})
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["a3"]
    assert index.tenant_inflight("a") == 4


def test_inflight_by_tenant_counts_each_tenants_leases(index: DispatchIndex) -> None:
    assert index.inflight_by_tenant() == {}
    index.set_caps({"free": 2})
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0), job("a3", "a", key=3.0),
         job("b1", "b", key=4.0), job("c1", "c", key=5.0))
    assert ids(index.dispatch(3, now=0.0, lease_ttl_s=TTL)) == ["a1", "a2", "b1"]
    assert index.inflight_by_tenant() == {"a": 2, "b": 1}
    assert index.release("b1", attempt=1) is False
    assert index.inflight_by_tenant() == {"a": 2}
    assert ids(index.reap(now=TTL + 1)) == ["a1", "a2"]
    assert index.inflight_by_tenant() == {}


def test_set_caps_overrides_replace_and_lowered_caps_block(index: DispatchIndex) -> None:
    fill(index, *(job(f"a{i}", "a", key=float(i)) for i in range(5)))
    index.set_caps({"free": 1}, {"a": 2})
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["a0", "a1"]
    index.set_caps({"free": 1})  # None clears the override: back to the tier cap of 1
    assert index.release("a0") is False
    assert index.dispatch(10, now=0.0, lease_ttl_s=TTL) == []
    assert index.release("a1") is True
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["a2"]


def test_set_caps_rejects_caps_below_one(index: DispatchIndex) -> None:
    with pytest.raises(ValueError):
        index.set_caps({"free": 0})
    with pytest.raises(ValueError):
        index.set_caps({"free": 2}, {"a": -1})
    fill(index, job("a1", "a"), job("a2", "a"))
    assert len(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == 1  # nothing was stored


def test_n_larger_than_available_and_n_zero(index: DispatchIndex) -> None:
    fill(index, job("a", "t1"), job("b", "t2"))
    assert index.dispatch(0, now=0.0, lease_ttl_s=TTL) == []
    assert index.dispatch(-3, now=0.0, lease_ttl_s=TTL) == []
    assert ids(index.dispatch(100, now=0.0, lease_ttl_s=TTL)) == ["a", "b"]
    assert index.dispatch(100, now=0.0, lease_ttl_s=TTL) == []


def test_many_tenants_half_blocked(index: DispatchIndex) -> None:
    tenants = [f"t{i:03d}" for i in range(200)]
    fill(index, *(job(f"{t}-lead", t, key=-1.0) for t in tenants[::2]))
    assert len(index.dispatch(100, now=0.0, lease_ttl_s=TTL)) == 100
    fill(index, *(job(f"{t}-{k}", t, key=float(k)) for t in tenants for k in range(3)))
    leases = index.dispatch(1000, now=0.0, lease_ttl_s=TTL)
    assert sorted(lease.tenant for lease in leases) == tenants[1::2]
    assert all(lease.job_id.endswith("-0") for lease in leases)
    assert index.tenant_queued(tenants[0]) == 3


# -- leases --


def test_renew_true_while_leased_false_after(index: DispatchIndex) -> None:
    fill(index, job("a"))
    assert index.renew("a", attempt=1, ttl_s=50.0, now=0.0) is False  # queued, not leased
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    assert index.renew("a", attempt=1, ttl_s=50.0, now=0.0) is True
    assert index.reap(now=40.0) == []
    assert ids(index.reap(now=50.0)) == ["a"]
    assert index.renew("a", attempt=1, ttl_s=90.0, now=0.0) is False
    assert index.renew("nope", attempt=1, ttl_s=90.0, now=0.0) is False


def test_a_lease_belongs_to_its_attempt(index: DispatchIndex) -> None:
    index.requeue(replace(job("a"), attempt=2))
    (lease,) = index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    assert lease.attempt == 2 and lease.expires_at == TTL
    assert index.renew("a", attempt=1, ttl_s=100.0, now=0.0) is False  # a zombie attempt 1
    assert index.release("a", attempt=1) is False
    assert index.inflight() == 1
    assert index.renew("a", attempt=2, ttl_s=5.0, now=0.0) is True  # never moves back
    assert index.reap(now=TTL - 0.01) == []
    index.requeue(job("a"))  # an earlier attempt's late requeue: the lease is newer
    index.requeue(replace(job("a"), attempt=2))  # nor a requeue read before the dispatch
    assert index.inflight() == 1 and index.position("a") is None
    index.release("a", attempt=2)
    assert index.inflight() == 0


def test_dispatch_with_a_capacity_fills_only_the_free_slots(index: DispatchIndex) -> None:
    index.set_caps({"free": BIG})
    index.register_worker("w", slots=BIG, ttl_s=TTL, now=0.0)
    fill(index, *(job(f"j{n}", key=float(n)) for n in range(6)))
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL, capacity=2)) == ["j0", "j1"]
    assert index.dispatch(10, now=0.0, lease_ttl_s=TTL, capacity=2) == []  # none free
    index.release("j0")
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL, capacity=3)) == ["j2", "j3"]
    assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL, capacity=10)) == ["j4"]  # n still caps


def test_a_capacity_is_cut_to_the_live_workers_slots(index: DispatchIndex) -> None:
    """A configured capacity admits work a pool with no live worker cannot start yet: no
    lease is taken into slots that are not there, where it would only lapse."""
    index.set_caps({"free": BIG})
    fill(index, *(job(f"j{n}", key=float(n)) for n in range(4)))
    assert index.dispatch(10, now=0.0, lease_ttl_s=TTL, capacity=8) == []
    assert index.position("j0") == 0 and index.inflight() == 0
    index.register_worker("w", slots=1, ttl_s=TTL, now=0.0)
    assert ids(index.dispatch(10, now=1.0, lease_ttl_s=TTL, capacity=8)) == ["j0"]
    index.register_worker("w2", slots=1, ttl_s=TTL, now=1.0)
    assert ids(index.dispatch(10, now=2.0, lease_ttl_s=TTL, capacity=8)) == ["j1"]
    # The first registration lapsed: the slot it brought is gone with it.
    index.release("j0")
    assert index.dispatch(10, now=TTL + 0.5, lease_ttl_s=TTL, capacity=8) == []
    index.release("j1")
    assert ids(index.dispatch(10, now=TTL + 0.5, lease_ttl_s=TTL, capacity=8)) == ["j2"]


def test_a_cancel_flag_is_seen_by_the_renewal_of_its_attempt_only(index: DispatchIndex) -> None:
    fill(index, job("a"))
    assert index.flag_cancel("a") is False  # queued: no lease to flag
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    assert index.renew_checked("a", attempt=1, ttl_s=TTL, now=0.0) is Renewal.HELD
    assert index.flag_cancel("a", attempt=2) is False  # another attempt's: left alone
    assert index.flag_cancel("a", attempt=1) is True
    assert index.flag_cancel("a") is True  # twice is harmless
    assert index.renew_checked("a", attempt=1, ttl_s=TTL, now=1.0) is Renewal.CANCEL_REQUESTED
    assert index.renew("a", attempt=1, ttl_s=TTL, now=1.0) is True  # still held
    assert index.renew_checked("a", attempt=2, ttl_s=TTL, now=1.0) is Renewal.LOST
    # The flag goes with the lease: the next attempt starts without it.
    assert ids(index.reap(now=1.0 + TTL)) == ["a"]
    index.requeue(replace(job("a"), attempt=2))
    index.dispatch(1, now=2.0 + TTL, lease_ttl_s=TTL)
    assert index.renew_checked("a", attempt=2, ttl_s=TTL, now=2.0 + TTL) is Renewal.HELD
    index.release("a", attempt=2)
    assert index.renew_checked("a", attempt=2, ttl_s=TTL, now=2.0 + TTL) is Renewal.LOST


def test_now_left_out_is_the_index_clock(index: DispatchIndex) -> None:
    fill(index, job("a"))
    before = index.now()
    (lease,) = index.dispatch(1, lease_ttl_s=TTL)
    assert before + TTL <= lease.expires_at <= index.now() + TTL
    assert index.reap() == []
    assert index.renew("a", attempt=1, ttl_s=TTL) is True


def test_release_return_value(index: DispatchIndex) -> None:
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0), job("b1", "b"))
    index.dispatch(10, now=0.0, lease_ttl_s=TTL)
    assert index.release("b1") is False  # nothing queued for b
    assert index.release("a1") is True
    assert index.release("a1") is False  # already gone
    assert index.release("unknown") is False
    assert index.release("a2") is False  # queued, not leased
    assert index.position("a2") == 0
    assert index.inflight() == 0


def test_cancel_queued_delayed_unknown_leased(index: DispatchIndex) -> None:
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0), job("b1", "b", key=3.0))
    fill(index, job("d1", "d", not_before=50.0))
    assert index.cancel("a1") is True
    assert index.cancel("a1") is False
    assert index.cancel("unknown") is False
    assert index.cancel("d1") is True
    assert index.tenant_queued("d") == 0
    assert index.position("b1") == 1
    leased = index.dispatch(1, now=100.0, lease_ttl_s=TTL)
    assert ids(leased) == ["a2"]
    assert index.cancel("a2") is False
    assert index.tier_depths(["free"])["free"] == TierDepth(queued=1, oldest_order_key=3.0)


def test_reap_returns_expired_leases_and_frees_the_slot(index: DispatchIndex) -> None:
    fill(index, job("a1", "a", key=1.0), job("a2", "a", key=2.0), job("b1", "b", key=3.0))
    index.dispatch(1, now=0.0, lease_ttl_s=10.0)  # a1 until 10
    index.dispatch(1, now=5.0, lease_ttl_s=10.0)  # b1 until 15 (a is at its cap)
    assert index.reap(now=9.9) == []
    reaped = index.reap(now=10.0)
    assert reaped == [Lease(job_id="a1", tenant="a", tier="free", order_key=1.0, expires_at=10.0)]
    assert index.tenant_inflight("a") == 0
    assert ids(index.dispatch(10, now=10.0, lease_ttl_s=10.0)) == ["a2"]
    assert ids(index.reap(now=100.0)) == ["b1", "a2"]
    assert index.inflight() == 0


def test_reap_limit_oldest_first_ties_by_job_id(index: DispatchIndex) -> None:
    fill(index, *(job(f"j{i}", f"t{i}") for i in (3, 1, 2)))
    index.dispatch(10, now=0.0, lease_ttl_s=1.0)
    assert ids(index.reap(now=5.0, limit=2)) == ["j1", "j2"]
    assert ids(index.reap(now=5.0, limit=0)) == []
    assert ids(index.reap(now=5.0)) == ["j3"]


def test_expire_due(index: DispatchIndex) -> None:
    fill(
        index,
        job("a", "t1", key=1.0, start_by=20.0), job("b", "t2", key=2.0, start_by=10.0),
        job("c", "t3", key=3.0), job("d", "t4", key=0.0, start_by=15.0, not_before=99.0),
    )
    assert index.expire_due(now=5.0) == []
    expired = index.expire_due(now=15.0)
    assert expired == [
        job("b", "t2", key=2.0, start_by=10.0),
        job("d", "t4", key=0.0, start_by=15.0, not_before=99.0),
    ]
    assert index.tier_depths(["free"])["free"].queued == 2
    assert index.position("c") == 1
    assert ids(index.dispatch(1, now=16.0, lease_ttl_s=TTL)) == ["a"]
    assert index.expire_due(now=30.0) == []  # a is leased now: not the index's to expire


def test_a_job_popped_before_its_row_commits_keeps_its_deadline(index: DispatchIndex) -> None:
    """A round pops a job whose row is not visible yet and queues it again from its lease
    alone (``retry_soon``): the lease carries the deadline the entry was indexed with, so
    the job expires at it like a peer with the same deadline, while the pool stays full."""
    index.register_worker("w", slots=1, ttl_s=BIG, now=0.0)
    fill(index, job("early", "t1", key=1.0, start_by=25.0), job("busy", "t2", key=2.0),
         job("peer", "t3", key=3.0, start_by=25.0))
    popped = index.dispatch(10, now=10.0, lease_ttl_s=TTL, capacity=1)
    assert popped == [Lease(job_id="early", tenant="t1", tier="free", order_key=1.0,
                            expires_at=40.0, start_by=25.0)]
    index.release("early", attempt=1)
    index.requeue(retry_soon(popped[0], 10.0))
    assert ids(index.dispatch(10, now=10.0, lease_ttl_s=TTL, capacity=1)) == ["busy"]
    assert index.dispatch(10, now=20.0, lease_ttl_s=TTL, capacity=1) == []  # the pool is full
    assert index.expire_due(now=24.9) == []
    expired = index.expire_due(now=25.0)
    assert [(item.job_id, item.start_by) for item in expired] == [("early", 25.0), ("peer", 25.0)]
    assert index.tenant_queued("t1") == 0 and index.position("peer") is None


def test_a_reaped_lease_carries_its_deadline_and_is_restored_with_it(
    index: DispatchIndex,
) -> None:
    fill(index, job("a", "t1", key=1.0, start_by=50.0), job("b", "t2", key=2.0))
    leased = index.dispatch(10, now=0.0, lease_ttl_s=10.0)
    assert [(lease.job_id, lease.start_by) for lease in leased] == [("a", 50.0), ("b", None)]
    reaped = index.reap(now=10.0)
    assert [(lease.job_id, lease.start_by) for lease in reaped] == [("a", 50.0), ("b", None)]
    assert index.restore_lease(lease_entry(reaped[0]), ttl_s=0.0, now=10.0)  # handed back
    again = index.reap(now=10.0)
    assert again == [replace(reaped[0], expires_at=10.0)]


def test_delayed_jobs_wait_for_not_before(index: DispatchIndex) -> None:
    result = index.admit(job("late", "t1", key=0.0, not_before=50.0), bound=BIG)
    assert result.accepted
    fill(index, job("now", "t2", key=1.0))
    # Both wait; the delayed one waits for its time, not a slot: the oldest queued is "now".
    assert index.tier_depths(["free"])["free"] == TierDepth(queued=2, oldest_order_key=1.0)
    assert index.tenant_queued("t1") == 1
    assert index.position("late") is None
    assert ids(index.dispatch(10, now=49.0, lease_ttl_s=TTL)) == ["now"]
    assert ids(index.dispatch(10, now=50.0, lease_ttl_s=TTL)) == ["late"]
    assert index.tenant_queued("t1") == 0


def test_requeue_replaces_without_duplicates(index: DispatchIndex) -> None:
    fill(index, job("a", key=5.0), job("b", "t2", key=3.0))
    index.requeue(job("a", key=1.0))
    assert index.tier_depths(["free"])["free"].queued == 2
    assert index.position("a") == 0
    leases = index.dispatch(10, now=0.0, lease_ttl_s=TTL)
    assert ids(leases) == ["a", "b"]
    index.requeue(replace(job("a", key=1.0, not_before=10.0), attempt=2))  # a retry: lease goes
    assert index.tenant_inflight("t1") == 0
    assert index.release("a") is False
    assert ids(index.dispatch(10, now=10.0, lease_ttl_s=TTL)) == ["a"]


def test_admitting_a_delayed_job_reports_the_rank_it_will_have(index: DispatchIndex) -> None:
    fill(index, job("a", "t1", key=1.0), job("c", "t2", key=3.0))
    late = index.admit(job("b", "t3", key=2.0, not_before=10.0), bound=BIG)
    assert late == Admitted(accepted=True, tier_queued=3, tenant_queued=1, position=1)
    again = index.admit(job("b", "t3", key=2.0), bound=BIG)
    assert (again.duplicate, again.position) == (True, 1)
    assert ids(index.dispatch(10, now=10.0, lease_ttl_s=TTL)) == ["a", "b", "c"]
    assert index.admit(job("b", "t3"), bound=BIG).position == 0  # leased


def test_requeue_many_loads_in_chunks(
    index: DispatchIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_index, "REQUEUE_CHUNK", 2)
    loader = cast(MemoryIndex | RedisIndex, index)
    count = loader.requeue_many(job(f"j{i}", f"t{i % 2}", key=float(-i)) for i in range(5))
    assert count == 5
    assert [index.position(f"j{i}") for i in range(5)] == [4, 3, 2, 1, 0]
    assert loader.requeue_many([job("j0", key=-10.0)]) == 1
    assert index.position("j0") == 0
    assert index.tier_depths(["free"])["free"] == TierDepth(queued=5, oldest_order_key=-10.0)
    assert ids(index.dispatch(10, now=0.0, lease_ttl_s=TTL)) == ["j0", "j4"]


def test_position_counts_jobs_ahead(index: DispatchIndex) -> None:
    fill(index, *(job(f"j{i}", f"t{i % 3}", key=float(10 - i)) for i in range(10)))
    for i in range(10):
        assert index.position(f"j{i}") == 9 - i
    assert index.position("missing") is None


def test_tier_depths(index: DispatchIndex) -> None:
    fill(
        index, job("a", key=4.0), job("b", key=2.0, tier="paid"), job("c", key=3.0),
        job("d", key=1.0, tier="paid", not_before=9.0),
    )
    assert index.tier_depths(["free", "paid", "none"]) == {
        "free": TierDepth(queued=2, oldest_order_key=3.0),
        "paid": TierDepth(queued=2, oldest_order_key=2.0),  # d, delayed, is not the oldest
        "none": TierDepth(queued=0, oldest_order_key=None),
    }


def test_depths_and_inflight_are_the_depths_and_the_leases(index: DispatchIndex) -> None:
    fill(index, job("a", key=1.0), job("b", "t2", key=2.0), job("c", "t3", key=3.0))
    index.dispatch(2, now=0.0, lease_ttl_s=TTL)
    depths, inflight = index.depths_and_inflight(["free", "none"])
    assert depths == index.tier_depths(["free", "none"])
    assert depths["free"] == TierDepth(queued=1, oldest_order_key=3.0)
    assert inflight == index.inflight() == 2


def counts_while_moving(
    client: redis.Redis, prefix: str, count: Callable[[RedisIndex], int], reads: int = 2000
) -> set[int]:
    """``count``'s answers while another thread leases tenant t1's one job and requeues it
    (a new attempt), over and over: a count of the job read in two steps sees it in neither
    place, or in both, now and then."""
    index = RedisIndex(client, prefix)
    fill(index, job("a"))
    stop, failed = threading.Event(), []

    def lease_and_requeue() -> None:
        try:
            attempt = 1
            while not stop.is_set():
                assert ids(index.dispatch(1, now=0.0, lease_ttl_s=TTL)) == ["a"]
                attempt += 1
                index.requeue(replace(job("a"), attempt=attempt))
        except BaseException as exc:  # told to the test, not lost with the thread
            failed.append(exc)

    mover = threading.Thread(target=lease_and_requeue)
    mover.start()
    try:
        counts = {count(index) for _ in range(reads)}
    finally:
        stop.set()
        mover.join()
    assert not failed, failed
    return counts


def test_a_job_moving_between_queued_and_leased_is_counted_once_in_every_read(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """/v1/queues reads both: a lease taken between a read of the queues and one of the
    leases would leave the job in neither (or both, the other way round)."""

    def pool(index: RedisIndex) -> int:
        depths, inflight = index.depths_and_inflight(["free"])
        return depths["free"].queued + inflight

    assert counts_while_moving(redis_client, key_prefix, pool) == {1}


def test_tenant_counts_are_its_queued_and_its_inflight(index: DispatchIndex) -> None:
    fill(index, job("a", key=1.0), job("b", key=2.0), job("c", "t2", key=0.5))
    index.requeue(job("d", key=3.0, not_before=50.0))
    index.set_caps({"free": 1})
    assert ids(index.dispatch(2, now=0.0, lease_ttl_s=TTL)) == ["c", "a"]
    assert index.tenant_counts("t1") == (index.tenant_queued("t1"),
                                         index.tenant_inflight("t1")) == (2, 1)
    assert index.tenant_counts("nobody") == (0, 0)


def test_a_tenants_job_moving_between_queued_and_leased_is_counted_once_in_every_read(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    def tenant(index: RedisIndex) -> int:
        return sum(index.tenant_counts("t1"))

    assert counts_while_moving(redis_client, key_prefix, tenant) == {1}


def test_pool_capacity_with_expiry(index: DispatchIndex) -> None:
    assert index.pool_capacity(now=0.0) == 0
    index.register_worker("w1", slots=2, ttl_s=10.0, now=0.0)
    index.register_worker("w2", slots=3, ttl_s=20.0, now=0.0)
    assert index.pool_capacity(now=5.0) == 5
    assert index.pool_capacity(now=10.0) == 3
    index.register_worker("w2", slots=4, ttl_s=30.0, now=0.0)
    assert index.pool_capacity(now=10.0) == 4
    index.unregister_worker("w2")
    index.unregister_worker("never")
    assert index.pool_capacity(now=0.0) == 0


def test_live_workers_say_their_device_and_slots_until_they_expire(
    index: DispatchIndex,
) -> None:
    assert index.live_workers(now=0.0) == []
    index.register_worker("gpu-host@1", slots=1, ttl_s=10.0, now=0.0, device="cuda:0",
                          memory_bytes=80 * 2**30)
    index.register_worker("cpu-host@2", slots=4, ttl_s=20.0, now=0.0)
    assert index.live_workers(now=5.0) == [
        LiveWorker(worker_id="cpu-host@2", slots=4, device="cpu", expires_at=20.0),
        LiveWorker(worker_id="gpu-host@1", slots=1, device="cuda:0", expires_at=10.0,
                   memory_bytes=80 * 2**30),
    ]
    assert [w.worker_id for w in index.live_workers(now=10.0)] == ["cpu-host@2"]
    index.register_worker("gpu-host@1", slots=2, ttl_s=30.0, now=10.0, device="cuda:1")
    assert index.live_workers(now=10.0)[1] == LiveWorker(  # a memory not told is not kept
        worker_id="gpu-host@1", slots=2, device="cuda:1", expires_at=40.0)
    assert index.pool_capacity(now=10.0) == 6  # the device is no slot
    index.unregister_worker("gpu-host@1")
    assert [w.worker_id for w in index.live_workers(now=10.0)] == ["cpu-host@2"]
    assert index.pool_capacity(now=10.0) == 4


def test_names_and_scores_round_trip(index: DispatchIndex) -> None:
    tenant, tier = 'ten:ant "q" \\ ü\x00{x}', "tier:\u00e9 [1]"
    key = 1722222222.123456789 + 0.1
    fill(index, job("j", tenant, key=key, tier=tier, start_by=key + 1e-6))
    assert index.tenant_queued(tenant) == 1
    assert index.tier_depths([tier])[tier] == TierDepth(queued=1, oldest_order_key=key)
    (lease,) = index.dispatch(1, now=key, lease_ttl_s=0.1)
    assert lease == Lease(job_id="j", tenant=tenant, tier=tier, order_key=key,
                          expires_at=key + 0.1, start_by=key + 1e-6)
    assert index.tenant_inflight(tenant) == 1


def test_clear_forgets_everything(index: DispatchIndex) -> None:
    fill(index, job("a"), job("b", "t2"))
    index.dispatch(1, now=0.0, lease_ttl_s=TTL)
    index.register_worker("w", slots=1, ttl_s=10.0, now=0.0)
    index.clear()
    assert index.inflight() == 0
    assert index.tier_depths(["free"])["free"].queued == 0
    assert index.pool_capacity(now=0.0) == 0
    assert index.position("b") is None
    assert index.admit(job("a"), bound=1).accepted


def test_concurrent_admit_never_overshoots_the_bound(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    index = RedisIndex(redis_client, key_prefix)
    results: list[Admitted] = []
    lock = threading.Lock()

    def admit_many(worker: int) -> None:
        mine = [
            index.admit(job(f"w{worker}-{i}", f"t{worker}", key=float(i)), bound=100)
            for i in range(50)
        ]
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=admit_many, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(r.accepted for r in results) == 100
    assert {r.reason for r in results if not r.accepted} == {"capacity"}
    assert index.tier_depths(["free"])["free"].queued == 100
