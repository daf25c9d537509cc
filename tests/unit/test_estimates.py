"""Admission with the tenant's side of the wait, on the in-memory index twin: the estimate an
accepted job is told, and the deadline refusal of a job its own cap would make late."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest

from jobs.admission import estimates, limits
from jobs.core.domain import NewJob, Tenant
from jobs.core.errors import CapacityExceeded
from jobs.index import MemoryIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings

pytestmark = pytest.mark.unit

NOW = 1_000_000.0


@pytest.fixture
def runtime() -> Runtime:
    """No SQL and no Redis: admission only needs the policy and the index."""
    settings = load_settings(policy={"pool_concurrency": 4, "mean_service_s": 10.0})
    none = cast(Any, None)
    return Runtime(settings=settings, policy=settings.build_policy(), engine=none,
                   sessions=none, redis=none, index=MemoryIndex())


def tenant(name: str = "acme", **overrides: Any) -> Tenant:
    return Tenant(id=f"t-{name}", name=name, tier="standard", api_key_hash="x",
                  created_at=NOW, **{"max_queued": 10, **overrides})


def job(runtime: Runtime, owner: Tenant, at: float, max_wait_s: float | None = None) -> NewJob:
    return NewJob(tenant_id=owner.id, tier=owner.tier, kind="sleep", payload={},
                  order_key=runtime.policy.order_key(owner.tier, at), enqueued_at=at,
                  max_wait_s=max_wait_s)


def admit(runtime: Runtime, owner: Tenant, new: NewJob) -> estimates.Placement:
    return limits.admit(runtime, owner, new)  # the pool: pool_concurrency, 4 slots


def test_a_tenant_at_its_cap_is_told_its_own_wait_and_refused_a_shorter_max_wait(
    runtime: Runtime,
) -> None:
    acme = tenant()  # standard on 4 slots: cap max(1, floor(0.4)) = 1
    assert admit(runtime, acme, job(runtime, acme, NOW)) == estimates.Placement(
        position=0, estimated_wait_s=0.0)
    runtime.index.dispatch(1, now=NOW, lease_ttl_s=30)  # its one slot: a 10 s job

    with pytest.raises(CapacityExceeded) as caught:
        admit(runtime, acme, job(runtime, acme, NOW + 1, max_wait_s=2))
    assert caught.value.details["limit"] == "deadline"
    assert caught.value.details["estimated_wait_s"] == 10.0
    assert caught.value.retry_after_s == 10
    assert runtime.index.tenant_queued(acme.id) == 0  # nothing left behind

    assert admit(runtime, acme, job(runtime, acme, NOW + 2)) == estimates.Placement(
        position=0, estimated_wait_s=10.0)
    assert admit(runtime, acme, job(runtime, acme, NOW + 3, max_wait_s=20)) == (
        estimates.Placement(position=1, estimated_wait_s=20.0))


def test_a_cap_with_room_leaves_the_pools_estimate(runtime: Runtime) -> None:
    roomy = tenant("roomy", cap=4)
    admit(runtime, roomy, job(runtime, roomy, NOW))
    runtime.index.set_caps({"standard": 1}, {roomy.id: 4})
    runtime.index.dispatch(1, now=NOW, lease_ttl_s=30)
    placed = admit(runtime, roomy, job(runtime, roomy, NOW + 1, max_wait_s=2))
    assert placed == estimates.Placement(position=0, estimated_wait_s=0.0)


def test_other_tenants_are_not_held_back_by_one_at_its_cap(runtime: Runtime) -> None:
    acme, other = tenant(), tenant("other")
    admit(runtime, acme, job(runtime, acme, NOW))
    runtime.index.dispatch(1, now=NOW, lease_ttl_s=30)
    admit(runtime, acme, job(runtime, acme, NOW + 1))
    # One job ahead (acme's), 3 free slots: the pool starts it at once; its cap is free.
    placed = admit(runtime, other, job(runtime, other, NOW + 2, max_wait_s=2))
    assert placed == estimates.Placement(position=1, estimated_wait_s=0.0)


def test_with_no_workers_the_tenant_side_refuses_nothing(runtime: Runtime) -> None:
    acme = tenant()
    admit(runtime, acme, job(runtime, acme, NOW))
    runtime.index.dispatch(1, now=NOW, lease_ttl_s=30)
    # No configured concurrency and no worker registered: a pool of 0 slots.
    idle = dataclasses.replace(runtime, policy=dataclasses.replace(runtime.policy,
                                                                   pool_concurrency=None))
    placed = limits.admit(idle, acme, job(runtime, acme, NOW + 1, max_wait_s=2))
    assert placed.estimated_wait_s is None  # no estimate, so no refusal on one


@pytest.mark.parametrize(("position", "runnable", "free_slots", "starts"), [
    (7, 2, 3, 2),  # the runnable jobs ahead leave it a free slot: only they start first
    (7, 3, 3, 7),  # they fill the free slots: every job ahead starts first
    (7, 0, 0, 7),  # no free slot: every job ahead
    (0, 0, 1, 0),
])
def test_the_jobs_that_start_first_are_the_runnable_ones_only_while_a_slot_is_left(
    position: int, runnable: int, free_slots: int, starts: int,
) -> None:
    assert estimates.starts_ahead(position, runnable, free_slots) == starts
