"""Admission's pure parts: Retry-After maths, the latest useful position, refusal messages,
payload text rules."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.admission import refusals
from jobs.admission.refusals import Refusal
from jobs.admission.submit import check_json
from jobs.core import policy
from jobs.core.errors import CapacityExceeded, InvalidRequest, TenantLimitExceeded
from jobs.fleet.metrics import percentile

pytestmark = pytest.mark.unit


def _refusal(**changes: Any) -> Refusal:
    values: dict[str, Any] = {
        "reason": "capacity", "tier": "free", "tenant_name": "acme", "position": 250,
        "tier_queued": 240, "tenant_queued": 5, "bound": 240, "quota": 5,
        "service_rate": 4.0, "tenant_rate": 1 / 6, "idle_retry_s": 30.0,
    }
    values.update(changes)
    return Refusal(**values)


def test_capacity_waits_for_one_place_at_the_service_rate() -> None:
    # At the bound: one job must be served, 1 / 4 s, rounded up to a whole second.
    assert refusals.capacity_retry_after_s(
        tier_queued=240, bound=240, service_rate=4.0, idle_retry_s=30) == 1
    # 10 over a lowered bound at 0.5 jobs/s: 11 services, 22 s.
    assert refusals.capacity_retry_after_s(
        tier_queued=250, bound=240, service_rate=0.5, idle_retry_s=30) == 22
    assert refusals.capacity_retry_after_s(
        tier_queued=1, bound=1, service_rate=1 / 600, idle_retry_s=30) == 600


def test_nothing_served_waits_one_worker_registration_period() -> None:
    assert refusals.idle_retry_s(lease_ttl_s=30) == 30
    assert refusals.idle_retry_s(lease_ttl_s=0.5) == refusals.MIN_REGISTRATION_S
    assert refusals.capacity_retry_after_s(
        tier_queued=1, bound=1, service_rate=0.0, idle_retry_s=30) == 30
    assert refusals.tenant_retry_after_s(tenant_rate=0.0, idle_retry_s=3.5) == 4


def test_tenant_limit_waits_for_its_own_queue_to_move_by_one() -> None:
    rate = policy.tenant_rate(cap=6, capacity=24, mean_service_s=6.0)
    assert rate == 1.0
    assert refusals.tenant_retry_after_s(tenant_rate=rate, idle_retry_s=30) == 1
    slow = policy.tenant_rate(cap=1, capacity=24, mean_service_s=6.0)
    assert refusals.tenant_retry_after_s(tenant_rate=slow, idle_retry_s=30) == 6
    # A cap over the whole pool cannot run faster than the pool.
    assert policy.tenant_rate(cap=50, capacity=2, mean_service_s=1.0) == 2.0
    assert policy.tenant_rate(cap=1, capacity=0, mean_service_s=6.0) == 0.0


def test_a_late_job_waits_for_the_queue_ahead_to_shrink_to_its_latest_position() -> None:
    # 30 ahead, it may have at most 9 ahead: 21 services at 2 jobs/s, 10.5 s -> 11 s.
    assert refusals.deadline_retry_after_s(position=30, max_position=9, service_rate=2.0) == 11
    # Even the head is too late (max position -1): one service.
    assert refusals.deadline_retry_after_s(position=0, max_position=-1, service_rate=0.25) == 4


@given(
    queued=st.integers(0, 10_000), bound=st.integers(1, 10_000),
    mu=st.floats(0, 1e4, allow_nan=False), idle=st.floats(0, 1e9, allow_nan=False),
    position=st.integers(0, 10_000), max_position=st.integers(-1, 10_000),
    next_token=st.floats(0, 1e9, allow_nan=False),
)
def test_retry_after_is_always_whole_seconds_of_at_least_one(
    queued: int, bound: int, mu: float, idle: float, position: int, max_position: int,
    next_token: float,
) -> None:
    values = [
        refusals.capacity_retry_after_s(
            tier_queued=queued, bound=bound, service_rate=mu, idle_retry_s=idle),
        refusals.tenant_retry_after_s(tenant_rate=mu, idle_retry_s=idle),
        refusals.deadline_retry_after_s(
            position=position, max_position=max_position, service_rate=mu),
        refusals.whole_seconds(next_token),
        refusals.tenant_deadline_retry_after_s(
            excess=position, max_excess=max_position, tenant_rate=mu),
    ]
    for value in values:
        assert isinstance(value, int) and 1 <= value <= refusals.MAX_RETRY_AFTER_S


def test_latest_useful_position_is_the_last_one_estimated_to_start_in_time() -> None:
    # 2 free slots, 0.5 jobs/s, 10 s: positions 0-1 start at once, 5 more within 10 s.
    assert policy.latest_useful_position(10, 2, 0.5) == 6
    assert policy.estimated_wait_s(6, 2, 0.5) == 10.0
    assert policy.estimated_wait_s(7, 2, 0.5) > 10
    # No free slot and a wait shorter than one service: not even the head is in time.
    assert policy.latest_useful_position(1, 0, 0.25) == -1
    # Nothing served: no estimate, so no refusal on it.
    assert policy.latest_useful_position(10, 0, 0.0) is None


@given(
    max_wait=st.floats(0.001, 1e5), free=st.integers(0, 1000), mu=st.floats(0.001, 1e4),
    position=st.integers(0, 100_000),
)
def test_a_position_is_useful_exactly_when_its_estimate_fits_the_wait(
    max_wait: float, free: int, mu: float, position: int
) -> None:
    latest = policy.latest_useful_position(max_wait, free, mu)
    assert latest is not None
    estimate = policy.estimated_wait_s(position, free, mu)
    if position <= latest:
        assert estimate <= max_wait * (1 + 1e-9) + 1e-9
    else:
        assert estimate > max_wait * (1 - 1e-9)


def test_capacity_refusal_names_the_bound() -> None:
    error = refusals.refused(_refusal())
    assert isinstance(error, CapacityExceeded)
    assert error.message == "tier 'free' is at its bound of 240 queued jobs"
    assert (error.tier, error.queue_position, error.retry_after_s) == ("free", 250, 1)
    assert error.details == {"limit": "bound", "tier_queued": 240, "bound": 240}


def test_capacity_refusal_over_a_lowered_bound_says_by_how_much() -> None:
    error = refusals.refused(_refusal(tier_queued=250, service_rate=0.5))
    assert error.message == "tier 'free' has 250 queued jobs, 10 over its bound of 240"
    assert error.retry_after_s == 22


def test_a_refusal_with_no_workers_says_so_and_waits_a_registration_period() -> None:
    error = refusals.refused(_refusal(tier_queued=1, bound=1, service_rate=0.0))
    assert error.message == "tier 'free' is at its bound of 1 queued jobs; no workers are serving"
    assert error.retry_after_s == 30
    quota = refusals.refused(_refusal(reason="tenant_limit", tenant_rate=0.0))
    assert quota.message.endswith("; no workers are serving")
    assert quota.retry_after_s == 30


def test_tenant_limit_refusal_names_the_tenant_and_its_limit() -> None:
    error = refusals.refused(_refusal(reason="tenant_limit"))
    assert isinstance(error, TenantLimitExceeded)
    assert error.type == "tenant_limit"
    assert error.message == "tenant 'acme' has 5 queued jobs, its limit is 5"
    assert error.retry_after_s == 6
    assert error.details == {"limit": "quota", "tenant_queued": 5, "quota": 5}


def test_deadline_refusal_gives_the_estimate_and_the_jobs_max_wait() -> None:
    # 250 ahead, 10 free slots, 4 jobs/s: starts in (250 + 1 - 10) / 4 = 60.25 s.
    error = refusals.refused(_refusal(reason="deadline", max_wait_s=30.0, max_position=129,
                                       free_slots=10))
    assert isinstance(error, CapacityExceeded)
    assert error.message == ("tier 'free' would start this job in about 61 s, later than its "
                             "max_wait_s of 30 s")
    assert error.retry_after_s == 31  # (250 - 129) / 4 = 30.25 s
    assert error.details == {"limit": "deadline", "estimated_wait_s": 60.25, "max_wait_s": 30.0}


def test_deadline_refusal_names_the_tenants_cap_when_its_own_jobs_hold_the_job_back() -> None:
    # 4 slots at 10 s: the pool would start it at once (3 free), but the tenant's one slot
    # (cap 1) is busy: about 10 s, and one own job must finish before it fits 2 s.
    load = policy.TenantLoad(cap=1, inflight=1, ahead=0)
    error = refusals.refused(_refusal(
        reason="deadline", tier="standard", position=0, free_slots=3, service_rate=0.4,
        tenant_rate=0.1, max_wait_s=2.0, max_position=2, tenant_load=load))
    assert isinstance(error, CapacityExceeded)
    assert error.message == ("tenant 'acme' has 1 running and 0 queued jobs at its cap of 1: "
                             "this job would start in about 10 s, later than its max_wait_s "
                             "of 2 s")
    assert error.retry_after_s == 10
    assert error.details == {"limit": "deadline", "estimated_wait_s": 10.0, "max_wait_s": 2.0,
                             "tenant_cap": 1, "tenant_inflight": 1, "tenant_queued_ahead": 0}


def test_deadline_retry_after_waits_for_the_later_of_the_limits_that_bind() -> None:
    # The pool: 250 ahead, 129 at most, 4 jobs/s: 31 s. The tenant: 1 running and 5 queued at
    # cap 1 (6 to finish), 30 s allows 5 at 1/6 per second: one more, 6 s.
    load = policy.TenantLoad(cap=1, inflight=1, ahead=5)
    both = refusals.refused(_refusal(reason="deadline", max_wait_s=30.0, max_position=129,
                                      free_slots=10, tenant_load=load))
    assert both.retry_after_s == 31
    assert both.details["estimated_wait_s"] == 60.25  # the pool's, the later
    # Alone the tenant binds: 6 s; with 100 own jobs queued, 96 more to finish: 576 s.
    alone = refusals.refused(_refusal(reason="deadline", position=0, max_wait_s=30.0,
                                       max_position=129, tenant_load=load))
    assert (alone.retry_after_s, alone.details["estimated_wait_s"]) == (6, 36.0)
    long = refusals.refused(_refusal(
        reason="deadline", position=0, max_wait_s=30.0, max_position=129,
        tenant_load=policy.TenantLoad(cap=1, inflight=1, ahead=100)))
    assert long.retry_after_s == 576
    assert refusals.tenant_deadline_retry_after_s(
        excess=1, max_excess=0, tenant_rate=0.0) == refusals.MAX_RETRY_AFTER_S


def test_rate_refusal_names_the_rate_and_waits_for_the_next_token() -> None:
    error = refusals.rate_refused(tier="free", tenant_name="acme", position=3, rate_per_s=2.0,
                                   burst=2, next_token_s=0.2)
    assert isinstance(error, TenantLimitExceeded)
    assert error.message == "tenant 'acme' is over its rate of 2 submits/s"
    assert (error.retry_after_s, error.queue_position, error.tier) == (1, 3, "free")
    assert error.details == {"limit": "rate", "rate_per_s": 2.0, "burst": 2}
    slow = refusals.rate_refused(tier="free", tenant_name="acme", position=0, rate_per_s=0.1,
                                  burst=1, next_token_s=9.3)
    assert slow.retry_after_s == 10


def test_result_retry_after_stays_between_one_and_five_seconds() -> None:
    assert refusals.result_retry_after_s(
        running=True, estimated_wait_s=None, mean_service_s=0.2) == 1
    assert refusals.result_retry_after_s(
        running=True, estimated_wait_s=None, mean_service_s=60) == 5
    assert refusals.result_retry_after_s(
        running=False, estimated_wait_s=1.5, mean_service_s=1.0) == 3
    assert refusals.result_retry_after_s(
        running=False, estimated_wait_s=math.inf, mean_service_s=1.0) == 5


@pytest.mark.parametrize(
    "payload",
    [
        {"a": "x\x00"},
        {"\x00": 1},
        {"a": ["ok", {"b": "\ud800"}]},
        {"a": math.nan},
        {"a": [math.inf]},
        {"a": 1, "deep": json.loads('{"a":' * 70 + "1" + "}" * 70)},
    ],
)
def test_payload_text_the_stores_cannot_keep_is_refused(payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_json(payload)
    assert caught.value.details["details"][0]["loc"][0] == "payload"


def test_ordinary_payloads_pass_unchanged() -> None:
    payload = {"text": "wörld 💥", "n": [1, 2.5, None, True], "nested": {"k": {"v": "x"}}}
    assert check_json(payload) is payload


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 0.5) is None
    assert percentile([4.0], 0.95) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([10.0, 0.0], 0.95) == pytest.approx(9.5)
