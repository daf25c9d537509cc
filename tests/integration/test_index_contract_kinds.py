"""The index contract of routing by kind (``jobs.index.worker_registry``), the twin and Redis
alike: a pool whose live workers registered the same kinds is not routed, and its fast paths
lease as before; one worker of other kinds, or a kind met that one does not run, routes it
(a submit's offer and a freed slot's hand-over lease nothing, the dispatch says so); a job
parked for a kind no live worker runs keeps its place and comes back at once when the leader
sees a worker of it; the leader stops routing once the workers agree again."""

from __future__ import annotations

import pytest

from jobs.index import DispatchIndex
from jobs.index.base import KindRoutes
from tests.integration.test_index_contract import BIG, TTL, fill, ids, job

pytestmark = pytest.mark.integration

LONG = 1e6  # registrations live for every ``now`` these tests pass


@pytest.fixture(autouse=True)
def whole(index: DispatchIndex) -> None:
    index.set_generation("1")


def test_workers_of_the_same_kinds_route_nothing_and_register_their_kinds(
    index: DispatchIndex,
) -> None:
    index.register_worker("a", slots=1, ttl_s=LONG, now=0.0, kinds=["echo", "sleep"])
    index.register_worker("b", slots=1, ttl_s=LONG, now=0.0, kinds=["sleep", "echo"])
    index.register_worker("old", slots=1, ttl_s=LONG, now=0.0)  # of an earlier version
    kinds = {w.worker_id: w.kinds for w in index.live_workers(now=1.0)}
    assert kinds == {"a": frozenset({"echo", "sleep"}), "b": frozenset({"echo", "sleep"}),
                     "old": None}
    index.unregister_worker("old")
    assert index.route_kinds(now=1.0) == KindRoutes(routed=False)
    fill(index, job("j1", key=1.0), job("j2", "t2", key=2.0))
    leases, routed = index.dispatch_routed(1, now=1.0, lease_ttl_s=TTL, capacity=BIG)
    assert (ids(leases), routed) == (["j1"], False)
    handed = index.hand_over("j1", attempt=1, lease_ttl_s=TTL, capacity=BIG, now=1.0)
    assert handed is not None and handed.job_id == "j2"  # the fast path as before


def test_a_worker_of_other_kinds_routes_the_pool_until_it_goes(index: DispatchIndex) -> None:
    index.register_worker("a", slots=2, ttl_s=LONG, now=0.0, kinds=["echo", "text.upper"])
    index.register_worker("b", slots=2, ttl_s=TTL, now=0.0, kinds=["echo"])
    fill(index, job("j1", key=1.0), job("j2", "t2", key=2.0))
    leases, routed = index.dispatch_routed(1, now=1.0, lease_ttl_s=TTL, capacity=BIG)
    assert (ids(leases), routed) == (["j1"], True)  # the caller sends it by its kind
    assert index.hand_over("j1", attempt=1, lease_ttl_s=TTL, capacity=BIG, now=1.0) is None
    assert index.position("j2") == 0  # left for the dispatcher
    assert index.route_kinds(now=2.0) == KindRoutes(routed=True)
    # b's registration lapses: the live workers agree again, and routing stops.
    assert index.route_kinds(now=TTL + 1) == KindRoutes(routed=False)
    leases, routed = index.dispatch_routed(1, now=TTL + 1, lease_ttl_s=TTL, capacity=BIG)
    assert (ids(leases), routed) == (["j2"], False)


def test_a_kind_met_that_no_worker_runs_parks_its_jobs_in_their_places(
    index: DispatchIndex,
) -> None:
    index.register_worker("b", slots=3, ttl_s=LONG, now=0.0, kinds=["echo"])
    fill(index, job("up1", key=1.0), job("echo1", "t2", key=2.0), job("up2", "t3", key=3.0))
    index.note_kinds_waiting(["text.upper"])  # b met up1's kind and had no handler for it
    leases, routed = index.dispatch_routed(3, now=1.0, lease_ttl_s=TTL, capacity=BIG)
    assert (ids(leases), routed) == (["up1", "echo1", "up2"], True)
    for lease in (leases[0], leases[2]):
        assert index.park(lease.job_id, attempt=1, kind="text.upper", until=31.0)
    assert not index.park("up1", attempt=1, kind="text.upper", until=31.0)  # not leased
    assert index.inflight() == 1 and index.position("up1") is None  # parked: delayed
    assert index.tenant_queued("t1") == 1  # still counted among its tenant's waiting jobs
    assert index.route_kinds(now=2.0) == KindRoutes(routed=True,
                                                    waiting=frozenset({"text.upper"}))
    # A worker of the kind registers: the leader brings them back at once, in their places.
    index.register_worker("a", slots=2, ttl_s=LONG, now=3.0, kinds=["echo", "text.upper"])
    routes = index.route_kinds(now=3.0, unpark=["text.upper"])
    assert routes == KindRoutes(routed=True, waiting=frozenset({"text.upper"}))
    assert [index.position(j) for j in ("up1", "up2")] == [0, 1]
    assert ids(index.dispatch(5, now=3.0, lease_ttl_s=TTL, capacity=BIG)) == ["up1", "up2"]
    # No job of it left: the kind is forgotten; a and b still differ, so still routed.
    assert index.route_kinds(now=4.0, forget=["text.upper"]) == KindRoutes(routed=True)


def test_a_waiting_kind_every_live_worker_runs_routes_nothing(index: DispatchIndex) -> None:
    index.register_worker("a", slots=1, ttl_s=LONG, now=0.0, kinds=["echo", "text.upper"])
    index.note_kinds_waiting(["text.upper"])  # met by a worker that has gone since
    assert index.route_kinds(now=1.0) == KindRoutes(routed=False,
                                                    waiting=frozenset({"text.upper"}))
    index.note_kinds_waiting(["gone.kind"])
    assert index.route_kinds(now=1.0).routed
