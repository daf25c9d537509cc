"""The live figures' maths: the measured mean service time, the bounds, caps and quotas that
follow μ and capacity, the tenant rate limits, and the token bucket (the in-memory twin)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core import policy
from jobs.core.policy import MeasuredMean, mean_service_s, weighted_mean
from jobs.fleet import pool
from jobs.index.rate_limit import MemoryRateLimiter
from jobs.process.settings import load_settings

pytestmark = pytest.mark.unit


@pytest.fixture
def pol() -> policy.Policy:
    return load_settings(policy={"pool_concurrency": 24}).build_policy()


# -- the measured mean -----------------------------------------------------------------------


def test_weighted_mean_halves_the_weight_every_half_life() -> None:
    assert weighted_mean([4.0] * 30) == pytest.approx(4.0)
    # Newest 2 s, then 4 s one half-life back: weights 1 and 1/2.
    assert weighted_mean([2.0, 4.0], half_life=1) == pytest.approx((2 + 4 * 0.5) / 1.5)
    # Recent runs count more than old ones.
    assert weighted_mean([1.0] * 10 + [9.0] * 10, half_life=5) < 5.0
    with pytest.raises(ValueError):
        weighted_mean([])


@given(st.lists(st.floats(0, 1e5), min_size=1, max_size=300))
def test_weighted_mean_lies_between_the_extremes(times: list[float]) -> None:
    assert min(times) - 1e-6 <= weighted_mean(times) <= max(times) + 1e-6


def test_the_measured_mean_counts_only_with_enough_samples(pol: policy.Policy) -> None:
    assert pol.service_samples_min == 20
    assert mean_service_s(pol, None) == 6.0
    assert mean_service_s(pol, MeasuredMean(mean_s=2.0, samples=19)) == 6.0
    assert mean_service_s(pol, MeasuredMean(mean_s=2.0, samples=20)) == 2.0
    assert mean_service_s(pol, MeasuredMean(mean_s=0.0, samples=50)) == 0.001


# -- figures follow μ and capacity -----------------------------------------------------------


def test_figures_follow_the_measured_mean(pol: policy.Policy) -> None:
    configured = pool.figures(pol, capacity=24, inflight=0)
    assert (configured.service_rate, configured.service_samples) == (4.0, 0)
    assert configured.bounds == {"premium": 24, "standard": 80, "free": 240}
    # Jobs take 3 s, not 6: μ doubles, and so does every bound and quota; caps do not move.
    measured = pool.figures(pol, capacity=24, inflight=0,
                                measured=MeasuredMean(mean_s=3.0, samples=40))
    assert (measured.service_rate, measured.service_samples) == (8.0, 40)
    assert measured.bounds == {"premium": 40, "standard": 160, "free": 480}
    assert measured.quotas == {"premium": 10, "standard": 16, "free": 19}
    assert measured.caps == configured.caps
    too_few = pool.figures(pol, capacity=24, inflight=0,
                               measured=MeasuredMean(mean_s=3.0, samples=5))
    assert too_few.bounds == configured.bounds and too_few.service_samples == 0


def test_figures_follow_capacity(pol: policy.Policy) -> None:
    small = pool.figures(pol, capacity=12, inflight=12)
    large = pool.figures(pol, capacity=48, inflight=12)
    assert small.bounds["free"] == 120 and large.bounds["free"] == 480
    assert small.caps["premium"] == 3 and large.caps["premium"] == 12
    assert (small.free_slots, large.free_slots) == (0, 36)
    # No workers at all: nothing is served, every bound and cap falls to its floor of 1.
    empty = pool.figures(pol, capacity=0, inflight=0)
    assert empty.service_rate == 0.0
    assert set(empty.bounds.values()) == set(empty.caps.values()) == {1}


def test_quota_is_a_share_of_the_bound(pol: policy.Policy) -> None:
    tiers = pol.tiers
    assert policy.tenant_quota(tiers["free"], 240) == 9  # floor(240 × 0.04)
    assert policy.tenant_quota(tiers["free"], 10) == 1  # floor 0.4 -> the floor of 1
    shared = policy.Tier(name="x", base_priority=0, max_wait_s=1, tenant_share=0.1,
                         queued_share=0.5)
    assert policy.tenant_quota(shared, 240) == 120


# -- rate limits -----------------------------------------------------------------------------


def test_rate_limit_comes_from_the_tier_or_the_tenant() -> None:
    plain = policy.Tier(name="t", base_priority=0, max_wait_s=5, tenant_share=0.5)
    assert policy.rate_limit(plain) is None
    assert policy.rate_limit(plain, rate_per_s=2.5) == policy.RateLimit(rate_per_s=2.5, burst=3)
    limited = policy.Tier(name="t", base_priority=0, max_wait_s=5, tenant_share=0.5,
                          rate_per_s=0.5)
    assert policy.rate_limit(limited) == policy.RateLimit(rate_per_s=0.5, burst=1)
    bursty = policy.Tier(name="t", base_priority=0, max_wait_s=5, tenant_share=0.5,
                         rate_per_s=2, rate_burst=10)
    assert policy.rate_limit(bursty) == policy.RateLimit(rate_per_s=2, burst=10)
    assert policy.rate_limit(bursty, burst=4) == policy.RateLimit(rate_per_s=2, burst=4)
    # A tenant's own rate brings its own default burst, not the tier's.
    assert policy.rate_limit(bursty, rate_per_s=5) == policy.RateLimit(rate_per_s=5, burst=5)


def test_token_bucket_allows_a_burst_then_one_token_per_interval() -> None:
    bucket = MemoryRateLimiter()
    taken = [bucket.take("acme", rate_per_s=2, burst=3, now=100.0) for _ in range(4)]
    assert [d.allowed for d in taken] == [True, True, True, False]
    assert taken[3].retry_after_s == pytest.approx(0.5)
    assert taken[2].tokens_left == 0
    assert not bucket.take("acme", rate_per_s=2, burst=3, now=100.25).allowed
    assert bucket.take("acme", rate_per_s=2, burst=3, now=100.5).allowed
    # Another tenant has its own bucket.
    assert bucket.take("other", rate_per_s=2, burst=3, now=100.5).allowed
    # Idle long enough, the bucket is full again, never fuller.
    later = [bucket.take("acme", rate_per_s=2, burst=3, now=200.0) for _ in range(4)]
    assert [d.allowed for d in later] == [True, True, True, False]


def test_a_clock_behind_the_last_caller_adds_no_tokens() -> None:
    bucket = MemoryRateLimiter()
    assert bucket.take("acme", rate_per_s=1, burst=1, now=50.0).allowed
    assert not bucket.take("acme", rate_per_s=1, burst=1, now=40.0).allowed
    assert bucket.take("acme", rate_per_s=1, burst=1, now=51.0).allowed


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_a_bucket_that_cannot_work_is_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        MemoryRateLimiter().take("acme", rate_per_s=rate, burst=burst, now=0.0)


@given(
    rate=st.floats(0.01, 100), burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0, 5), min_size=1, max_size=60),
)
def test_admitted_submits_never_exceed_burst_plus_rate_times_time(
    rate: float, burst: int, gaps: list[float]
) -> None:
    bucket, now, allowed = MemoryRateLimiter(), 0.0, 0
    for gap in gaps:
        now += gap
        decision = bucket.take("t", rate_per_s=rate, burst=burst, now=now)
        allowed += decision.allowed
        assert decision.allowed or decision.retry_after_s > 0
    assert allowed <= burst + rate * now + 1e-6
