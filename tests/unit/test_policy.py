"""The policy maths, checked against the worked example of docs/policy.md."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core import policy
from jobs.process.settings import load_settings

pytestmark = pytest.mark.unit


@pytest.fixture
def tiers() -> dict[str, policy.Tier]:
    return dict(load_settings().build_policy().tiers)


def test_service_rate_of_24_slots_at_6s_is_4_per_second() -> None:
    assert policy.service_rate(24, 6.0) == 4.0


def test_bounds_follow_littles_law(tiers: dict[str, policy.Tier]) -> None:
    mu = policy.service_rate(24, 6.0)
    bounds = {name: policy.queue_bound(tier, mu) for name, tier in tiers.items()}
    assert bounds == {"premium": 20, "standard": 80, "free": 240}


def test_client_timeout_caps_the_useful_wait(tiers: dict[str, policy.Tier]) -> None:
    mu = policy.service_rate(24, 6.0)
    assert policy.queue_bound(tiers["free"], mu, client_timeout_s=30) == 120
    # A timeout longer than the tier's own wait changes nothing.
    assert policy.queue_bound(tiers["premium"], mu, client_timeout_s=30) == 20


def test_bound_is_at_least_one(tiers: dict[str, policy.Tier]) -> None:
    assert policy.queue_bound(tiers["premium"], 0.0) == 1
    assert policy.queue_bound(tiers["premium"], 0.01) == 1


def test_a_bound_is_never_below_the_pools_slots(tiers: dict[str, policy.Tier]) -> None:
    # Premium waits 5 s at most, a job takes 6 s: Little's law gives 20 for 24 slots, and
    # 1 for 2 slots; the slots floor both, so a pool whose slots all free at once finds
    # enough jobs queued to start.
    assert policy.queue_bound(tiers["premium"], policy.service_rate(24, 6.0), capacity=24) == 24
    assert policy.queue_bound(tiers["premium"], policy.service_rate(2, 6.0), capacity=2) == 2
    # Above the slots, Little's law decides.
    assert policy.queue_bound(tiers["free"], policy.service_rate(24, 6.0), capacity=24) == 240
    assert policy.queue_bound(tiers["premium"], 0.0, capacity=0) == 1


def test_caps_of_a_24_slot_pool(tiers: dict[str, policy.Tier]) -> None:
    caps = {name: policy.tenant_cap(tier, 24) for name, tier in tiers.items()}
    # 24 × 0.04 = 0.96 rounds down to 0, and a cap of 0 would block the tenant forever.
    assert caps == {"premium": 6, "standard": 2, "free": 1}


def test_quota_defaults_to_the_tenant_share_of_the_bound(tiers: dict[str, policy.Tier]) -> None:
    assert policy.tenant_quota(tiers["premium"], 20) == 5
    assert policy.tenant_quota(tiers["free"], 240) == 9
    assert policy.tenant_quota(tiers["free"], 10) == 1


def test_free_within_120s_means_6s_per_point(tiers: dict[str, policy.Tier]) -> None:
    assert policy.ageing_rate_for(120, tiers["free"], tiers) == 6.0
    assert policy.ageing_guarantee_s(tiers["free"], tiers, 6.0) == 120.0
    assert policy.ageing_guarantee_s(tiers["standard"], tiers, 6.0) == 60.0
    assert policy.ageing_guarantee_s(tiers["premium"], tiers, 6.0) == 0.0
    with pytest.raises(ValueError, match="best priority"):
        policy.ageing_rate_for(120, tiers["premium"], tiers)


def test_a_free_job_that_waited_60s_outranks_fresh_standard_work(
    tiers: dict[str, policy.Tier],
) -> None:
    rate = 6.0
    free = policy.order_key(1000.0, tiers["free"].base_priority, rate)
    fresh_standard = policy.order_key(1060.0, tiers["standard"].base_priority, rate)
    assert free == fresh_standard  # they tie exactly at 60 s ...
    later_standard = policy.order_key(1060.5, tiers["standard"].base_priority, rate)
    assert free < later_standard  # ... and the free job wins once it has waited longer
    assert policy.effective_priority(20, 61, rate) < policy.effective_priority(10, 0, rate)


def test_a_free_job_ties_with_fresh_premium_work_at_120s(
    tiers: dict[str, policy.Tier],
) -> None:
    rate = 6.0
    free = policy.order_key(1000.0, tiers["free"].base_priority, rate)
    assert free == policy.order_key(1120.0, tiers["premium"].base_priority, rate)
    assert policy.effective_priority(20, 120, rate) == policy.effective_priority(0, 0, rate)


def test_retry_backoff_doubles_up_to_its_ceiling() -> None:
    assert [policy.retry_backoff_s(a, 2.0, 10.0) for a in (1, 2, 3, 4, 5)] == [2, 4, 8, 10, 10]


# Times on a 1/1024 s grid and rates whose products with the priorities are exact in binary
# floating point, so the static key is computed without rounding and ties are real ties.
times = st.integers(min_value=0, max_value=10_000 * 1024).map(lambda t: t / 1024)
jobs_strategy = st.lists(
    st.tuples(st.sampled_from([0.0, 10.0, 20.0]), times), min_size=1, max_size=40
)


@given(jobs=jobs_strategy, now=times, rate=st.sampled_from([1 / 32, 0.25, 1.0, 6.0, 30.0]))
def test_order_key_sorts_like_effective_priority(
    jobs: list[tuple[float, float]], now: float, rate: float
) -> None:
    """For any jobs and any ``now``: sorting by the static key equals sorting by effective
    priority at ``now`` (computed exactly), ties in arrival order (index in the list)."""

    def exact_priority(i: int) -> Fraction:
        base, enqueued_at = jobs[i]
        return Fraction(base) - (Fraction(now) - Fraction(enqueued_at)) / Fraction(rate)

    arrival = range(len(jobs))
    by_key = sorted(arrival, key=lambda i: (policy.order_key(jobs[i][1], jobs[i][0], rate), i))
    by_priority = sorted(arrival, key=lambda i: (exact_priority(i), i))
    assert by_key == by_priority


@given(
    capacity=st.integers(min_value=0, max_value=10_000),
    mean=st.floats(min_value=0.01, max_value=3_600),
    wait=st.floats(min_value=0.01, max_value=86_400),
    share=st.floats(min_value=1e-6, max_value=1.0),
)
def test_bounds_and_caps_are_never_below_one(
    capacity: int, mean: float, wait: float, share: float
) -> None:
    tier = policy.Tier(name="t", base_priority=0, max_wait_s=wait, tenant_share=share)
    mu = policy.service_rate(capacity, mean)
    bound = policy.queue_bound(tier, mu, capacity=capacity)
    assert bound >= max(1, capacity)
    assert bound <= max(1, capacity, math.floor(mu * wait) + 1)
    assert policy.tenant_cap(tier, capacity) >= 1
    assert policy.tenant_quota(tier, bound) >= 1


# -- the estimated wait: the pool's and the tenant's ----------------------------------------


def wait(position: int = 0, free: int = 0, mu: float = 0.4, *, cap: int = 1, inflight: int = 0,
         ahead: int = 0, capacity: int = 4, mean: float = 10.0) -> float:
    load = policy.TenantLoad(cap=cap, inflight=inflight, ahead=ahead)
    return policy.expected_wait_s(position, free, mu, tenant=load, capacity=capacity,
                                  mean_service_s=mean)


def test_a_tenant_under_its_cap_adds_nothing_to_the_pools_estimate() -> None:
    # 4 slots at 10 s (μ = 0.4/s), 3 free, cap 2: one running and none ahead leaves a slot.
    assert wait(5, 3, cap=2, inflight=1) == policy.estimated_wait_s(5, 3, 0.4) == 7.5
    assert wait(0, 3, cap=2, inflight=1) == 0.0


def test_a_tenant_at_its_cap_waits_for_its_own_jobs_to_finish() -> None:
    # The worked example of docs/policy.md: cap 1, a 10 s job running, the pool idle.
    assert policy.estimated_wait_s(0, 3, 0.4) == 0.0  # what the pool alone would say
    assert wait(0, 3, cap=1, inflight=1) == 10.0  # one own job must finish, at 0.1/s
    assert wait(1, 3, cap=1, inflight=1, ahead=1) == 20.0
    # Cap 2, both slots busy and one own job ahead: 2 must finish at 2 / 10 s.
    assert wait(1, 3, cap=2, inflight=2, ahead=1) == 10.0
    # The later of the two: the pool's own queue is longer here.
    assert wait(40, 0, cap=1, inflight=1) == 102.5


def test_a_cap_over_the_pool_finishes_no_faster_than_the_pool() -> None:
    assert policy.tenant_rate(8, 2, 6.0) == 2 / 6
    # Cap 8 on a 2-slot pool: 3 own jobs must finish first, 2 at a time every 6 s.
    load = policy.TenantLoad(cap=8, inflight=2, ahead=8)
    assert policy.tenant_wait_s(load, policy.tenant_rate(8, 2, 6.0)) == pytest.approx(9.0)


def test_with_nothing_served_a_tenant_at_its_cap_has_no_estimate() -> None:
    assert policy.tenant_rate(1, 0, 6.0) == 0.0
    assert wait(0, 0, 0.0, cap=1, inflight=1, capacity=0) == math.inf
    assert wait(0, 1, 0.0, cap=1, inflight=0, capacity=0) == 0.0


def test_the_latest_useful_excess_is_the_tenant_twin_of_the_latest_position() -> None:
    assert policy.latest_useful_excess(2.0, 0.1) == 0  # not even one own job may be first
    assert policy.latest_useful_excess(30.0, 0.1) == 3
    assert policy.latest_useful_excess(30.0, 0.0) is None  # nothing served: no estimate


wait_args = st.fixed_dictionaries({
    "position": st.integers(0, 1000), "free": st.integers(0, 100),
    "mu": st.floats(0, 100), "cap": st.integers(1, 50), "inflight": st.integers(0, 60),
    "ahead": st.integers(0, 1000), "capacity": st.integers(0, 100),
    "mean": st.floats(0.01, 3600),
})
# Raising these never shortens the wait; raising the others never lengthens it.
LENGTHEN = ("position", "inflight", "ahead", "mean")
SHORTEN = ("free", "mu", "cap", "capacity")


@given(args=wait_args, name=st.sampled_from(LENGTHEN + SHORTEN), step=st.integers(1, 100))
def test_the_estimate_is_monotone_in_each_argument(
    args: dict[str, Any], name: str, step: int
) -> None:
    more = dict(args)
    more[name] = args[name] * (1 + step / 10) if isinstance(args[name], float) else (
        args[name] + step)
    before, after = wait(**args), wait(**more)
    if name in LENGTHEN:
        assert after >= before
    else:
        assert after <= before


@given(args=wait_args)
def test_the_estimate_is_the_pools_when_far_under_the_cap_and_never_below_it(
    args: dict[str, Any],
) -> None:
    pool = policy.estimated_wait_s(args["position"], args["free"], args["mu"])
    assert wait(**args) >= pool
    if args["inflight"] + args["ahead"] < args["cap"]:
        assert wait(**args) == pool


@given(max_wait=st.floats(0.001, 1e5), rate=st.floats(0.001, 1e4),
       inflight=st.integers(0, 1000), ahead=st.integers(0, 1000), cap=st.integers(1, 100))
def test_a_tenant_is_in_time_exactly_when_its_own_wait_fits(
    max_wait: float, rate: float, inflight: int, ahead: int, cap: int
) -> None:
    load = policy.TenantLoad(cap=cap, inflight=inflight, ahead=ahead)
    latest = policy.latest_useful_excess(max_wait, rate)
    assert latest is not None
    own = policy.tenant_wait_s(load, rate)
    if load.excess <= latest:
        assert own <= max_wait * (1 + 1e-9) + 1e-9
    else:
        assert own > max_wait * (1 - 1e-9)


def test_prune_before_is_the_retention_period_back_and_none_keeps_forever() -> None:
    week = policy.Tier(name="t", base_priority=0, max_wait_s=5, tenant_share=0.5,
                       retention_s=604800)
    assert policy.prune_before(week, 1_000_000.0) == 1_000_000.0 - 604800
    forever = policy.Tier(name="t", base_priority=0, max_wait_s=5, tenant_share=0.5,
                          retention_s=0)
    assert policy.prune_before(forever, 1_000_000.0) is None
