"""The index contract of runs (``fill_run``): a slot's first item is leased as any job is;
its run is filled with queued jobs of its kind in the pool's order, under caps that count a
tenant's items in one run once, and the run holds one slot. Redis and the twin alike."""

from __future__ import annotations

import time

import pytest

from jobs.index import DispatchIndex
from jobs.index.base import RunCandidate
from tests.integration.test_index_contract import TTL, fill, ids, job

pytestmark = pytest.mark.integration


def lead(index: DispatchIndex, now: float, slots: int = 1) -> str:
    index.register_worker("w@host", slots=slots, ttl_s=TTL, now=now)
    leases = index.dispatch(1, now=now, lease_ttl_s=TTL, capacity=slots)
    assert len(leases) == 1
    return leases[0].job_id


def cands(*pairs: tuple[str, str], cost: int = 0) -> list[RunCandidate]:
    return [RunCandidate(job_id=j, tenant=t, cost=cost) for j, t in pairs]


def test_a_run_is_filled_in_order_and_holds_one_slot(index: DispatchIndex) -> None:
    now = time.time()
    fill(index, job("a", key=1), job("b", key=2), job("c", key=3), job("d", key=4))
    index.set_caps({"free": 1})
    assert lead(index, now) == "a"
    # Offered out of order: taken in the pool's order, to max_items.
    riders = index.fill_run("a", attempt=1, candidates=cands(("d", "t1"), ("b", "t1"),
                                                             ("c", "t1")),
                            max_items=3, lease_ttl_s=TTL, now=now)
    assert ids(riders) == ["b", "c"]
    assert all(r.attempt == 1 and r.expires_at == pytest.approx(now + TTL) for r in riders)
    # The run holds one unit of the tenant's cap (1): a second slot takes nothing of it.
    index.register_worker("w2@host", slots=1, ttl_s=TTL, now=now)
    assert index.dispatch(5, now=now, lease_ttl_s=TTL, capacity=2) == []
    assert index.tenant_inflight("t1") == 1
    # Each rider keeps a lease of its own: renewed, released alone.
    assert index.renew("b", attempt=1, ttl_s=TTL, now=now)
    for done in ("b", "c", "a"):
        index.release(done, attempt=1)
    assert index.inflight() == 0
    assert ids(index.dispatch(5, now=now, lease_ttl_s=TTL, capacity=2)) == ["d"]


def test_riders_hold_no_slot(index: DispatchIndex) -> None:
    now = time.time()
    fill(index, job("a", key=1), job("b", key=2), job("x", "t2", key=3))
    index.set_caps({"free": 5})
    assert lead(index, now, slots=2) == "a"
    assert ids(index.fill_run("a", attempt=1, candidates=cands(("b", "t1")), max_items=8,
                              lease_ttl_s=TTL, now=now)) == ["b"]
    # Two leases, one slot held: the second slot still takes the next job.
    assert ids(index.dispatch(5, now=now, lease_ttl_s=TTL, capacity=2)) == ["x"]


def test_other_tenants_join_under_their_caps_and_ride_once_in(index: DispatchIndex) -> None:
    now = time.time()
    fill(index, job("a", key=1), job("v0", "t3", key=1.5), job("u1", "t2", key=2),
         job("u2", "t2", key=3), job("v1", "t3", key=4), job("w1", "t4", key=5))
    index.set_caps({"free": 1})
    index.register_worker("w@host", slots=2, ttl_s=TTL, now=now)
    assert ids(index.dispatch(2, now=now, lease_ttl_s=TTL, capacity=2)) == ["a", "v0"]
    riders = index.fill_run("a", attempt=1,
                            candidates=cands(("u1", "t2"), ("u2", "t2"), ("v1", "t3"),
                                             ("w1", "t4")),
                            max_items=8, lease_ttl_s=TTL, now=now)
    # t3 is at its cap with v0's slot: v1 waits; t2's two items share one unit of its cap.
    assert ids(riders) == ["u1", "u2", "w1"]
    assert index.tenant_inflight("t2") == 1 and index.tenant_inflight("t4") == 1
    assert index.tenant_inflight("t3") == 1
    assert index.inflight_by_tenant() == {"t1": 1, "t2": 1, "t3": 1, "t4": 1}


def test_a_budget_stops_the_run_and_the_lead_must_hold_its_lease(index: DispatchIndex) -> None:
    now = time.time()
    fill(index, job("a", key=1), job("b", key=2), job("c", key=3))
    index.set_caps({"free": 5})
    assert lead(index, now) == "a"
    # A stale attempt of the lead leases nothing.
    assert index.fill_run("a", attempt=2, candidates=cands(("b", "t1")), max_items=8,
                          lease_ttl_s=TTL, now=now) == []
    riders = index.fill_run("a", attempt=1, candidates=cands(("b", "t1"), ("c", "t1"),
                                                             cost=40),
                            max_items=8, max_cost=100, lead_cost=30, lease_ttl_s=TTL, now=now)
    assert ids(riders) == ["b"]  # 30 + 40 fits 100, + 40 more would not
    # A candidate no longer queued (leased, gone, named with another tenant) is skipped.
    assert index.fill_run("a", attempt=1, candidates=cands(("b", "t1"), ("c", "t9"),
                                                           ("zz", "t1")),
                          max_items=8, lease_ttl_s=TTL, now=now) == []


def test_a_riders_lapsed_lease_is_reaped_as_any(index: DispatchIndex) -> None:
    now = time.time()
    fill(index, job("a", key=1), job("b", key=2))
    index.set_caps({"free": 5})
    assert lead(index, now) == "a"
    index.fill_run("a", attempt=1, candidates=cands(("b", "t1")), max_items=2,
                   lease_ttl_s=TTL, now=now)
    assert sorted(ids(index.reap(now=now + TTL + 1))) == ["a", "b"]
    assert index.inflight() == 0 and index.tenant_inflight("t1") == 0


def test_a_runs_leases_are_renewed_and_released_in_one_call(index: DispatchIndex) -> None:
    now = time.time()
    fill(index, job("a", key=1), job("b", key=2), job("c", key=3))
    index.set_caps({"free": 5})
    assert lead(index, now) == "a"
    index.fill_run("a", attempt=1, candidates=cands(("b", "t1"), ("c", "t1")), max_items=3,
                   lease_ttl_s=TTL, now=now)
    assert index.flag_cancel("c", attempt=1)
    renewed = index.renew_many([("b", 1, None), ("c", 1, None), ("b", 2, None)],
                               ttl_s=TTL, now=now + 10)
    assert [r.value for r in renewed] == [1, 2, 0]  # held, cancel asked, another attempt
    # Renewed to now + TTL: still held at the first TTL's end.
    assert ids(index.reap(now=now + TTL + 1)) == ["a"]
    assert index.release_many([("b", 1, "succeeded"), ("c", 1, None), ("c", 2, None)]) == 2
    assert index.inflight() == 0 and index.tenant_inflight("t1") == 0
