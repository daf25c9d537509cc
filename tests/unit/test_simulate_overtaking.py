"""The overtaking measure, kept incrementally, equals the one computed from its definition."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobs.simulate.overtaking import Overtaking

pytestmark = pytest.mark.unit

TENANT_TIER = [0, 0, 1, 1, 2, 2]
RANK = [0.0, 10.0, 20.0]
CAPS = [2, 1, 1, 2, 1, None]  # None: no cap

events = st.lists(st.tuples(st.sampled_from(["wait", "wait", "start", "start", "finish"]),
                            st.integers(0, len(TENANT_TIER) - 1), st.integers(0, 3)),
                  max_size=120)


@settings(max_examples=300, deadline=None)
@given(events)
# A free tenant at its cap with a job waiting, then a later premium job starts.
@example([("wait", 4, 0), ("wait", 4, 1), ("start", 4, 0), ("wait", 0, 1), ("start", 0, 1)])
def test_incremental_measure_equals_its_definition(steps: list[tuple[str, int, int]]) -> None:
    tracker = Overtaking(tenant_tier=TENANT_TIER, tier_rank=RANK, cap=CAPS.__getitem__)
    waiting: dict[int, tuple[int, float]] = {}  # job → (tenant, arrival)
    inflight = [0] * len(TENANT_TIER)
    running: list[int] = []  # tenants of running jobs
    wait_max, gap_max = [0.0] * 3, [0.0] * 3
    now, job = 0.0, 0
    for kind, tenant, step in steps:
        now += step
        if kind == "wait":
            waiting[job] = (tenant, now)
            tracker.wait(job, tenant, now)
            job += 1
        elif kind == "start":
            mine = [j for j, (t, _) in waiting.items() if t == tenant]
            if not mine:
                continue
            starter = min(mine, key=lambda j: (waiting[j][1], j))
            arrival = waiting[starter][1]
            for t, at in waiting.values():
                cap = CAPS[t]
                room = cap is None or inflight[t] < cap
                if RANK[TENANT_TIER[t]] > RANK[TENANT_TIER[tenant]] and room and at < arrival:
                    tier = TENANT_TIER[t]
                    wait_max[tier] = max(wait_max[tier], now - at)
                    gap_max[tier] = max(gap_max[tier], arrival - at)
            tracker.start(starter, tenant, arrival, now)
            del waiting[starter]
            inflight[tenant] += 1
            running.append(tenant)
        elif kind == "finish" and tenant in running:
            running.remove(tenant)
            inflight[tenant] -= 1
            tracker.finish(tenant)
    assert tracker.wait_max == wait_max
    assert tracker.gap_max == gap_max


def test_a_tenant_at_its_cap_is_not_overtaken() -> None:
    tracker = Overtaking(tenant_tier=[0, 1], tier_rank=[0.0, 20.0], cap=lambda t: 1)
    tracker.wait(0, 1, 0.0)
    tracker.start(0, 1, 0.0, 0.0)  # the free tenant runs one job: at its cap
    tracker.wait(1, 1, 1.0)
    tracker.wait(2, 0, 50.0)
    tracker.start(2, 0, 50.0, 60.0)
    assert tracker.gap_max == [0.0, 0.0]
    tracker.finish(1)  # room again: now a later premium job overtakes it
    tracker.wait(3, 0, 70.0)
    tracker.start(3, 0, 70.0, 80.0)
    assert tracker.gap_max == [0.0, 69.0]
    assert tracker.wait_max == [0.0, 79.0]
