"""Admission's pure parts: Retry-After maths, refusal messages, payload text rules."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs import admission
from jobs.admission import Refusal
from jobs.errors import CapacityExceeded, InvalidRequest, TenantLimitExceeded
from jobs.metrics import percentile
from jobs.submission import check_json

pytestmark = pytest.mark.unit


def _refusal(**changes: Any) -> Refusal:
    values: dict[str, Any] = {
        "reason": "capacity", "tier": "free", "tenant_name": "acme", "position": 250,
        "tier_queued": 240, "tenant_queued": 5, "bound": 240, "quota": 5,
        "service_rate": 4.0, "tenant_rate": 1 / 6, "fallback_s": 60.0,
    }
    values.update(changes)
    return Refusal(**values)


def test_capacity_waits_for_one_place_at_the_service_rate() -> None:
    # At the bound: one job must be served, 1 / 4 s, rounded up to a whole second.
    assert admission.capacity_retry_after_s(
        tier_queued=240, bound=240, service_rate=4.0, fallback_s=60) == 1
    # 10 over a lowered bound at 0.5 jobs/s: 11 services, 22 s.
    assert admission.capacity_retry_after_s(
        tier_queued=250, bound=240, service_rate=0.5, fallback_s=60) == 22
    assert admission.capacity_retry_after_s(
        tier_queued=1, bound=1, service_rate=1 / 600, fallback_s=60) == 600


def test_nothing_served_falls_back_to_the_tiers_wait() -> None:
    assert admission.capacity_retry_after_s(
        tier_queued=1, bound=1, service_rate=0.0, fallback_s=60) == 60
    assert admission.tenant_retry_after_s(tenant_rate=0.0, fallback_s=20) == 20


def test_tenant_limit_waits_for_its_own_queue_to_move_by_one() -> None:
    rate = admission.tenant_rate(cap=6, capacity=24, mean_service_s=6.0)
    assert rate == 1.0
    assert admission.tenant_retry_after_s(tenant_rate=rate, fallback_s=60) == 1
    slow = admission.tenant_rate(cap=1, capacity=24, mean_service_s=6.0)
    assert admission.tenant_retry_after_s(tenant_rate=slow, fallback_s=60) == 6
    # A cap over the whole pool cannot run faster than the pool.
    assert admission.tenant_rate(cap=50, capacity=2, mean_service_s=1.0) == 2.0
    assert admission.tenant_rate(cap=1, capacity=0, mean_service_s=6.0) == 0.0


@given(
    queued=st.integers(0, 10_000), bound=st.integers(1, 10_000),
    mu=st.floats(0, 1e4, allow_nan=False), fallback=st.floats(0, 1e9, allow_nan=False),
)
def test_retry_after_is_always_whole_seconds_of_at_least_one(
    queued: int, bound: int, mu: float, fallback: float
) -> None:
    value = admission.capacity_retry_after_s(
        tier_queued=queued, bound=bound, service_rate=mu, fallback_s=fallback)
    assert isinstance(value, int) and 1 <= value <= admission.MAX_RETRY_AFTER_S


def test_capacity_refusal_names_the_bound() -> None:
    error = admission.refused(_refusal())
    assert isinstance(error, CapacityExceeded)
    assert error.message == "tier 'free' is at its bound of 240 queued jobs"
    assert (error.tier, error.queue_position, error.retry_after_s) == ("free", 250, 1)
    assert error.details == {"tier_queued": 240, "bound": 240}


def test_tenant_limit_refusal_names_the_tenant_and_its_limit() -> None:
    error = admission.refused(_refusal(reason="tenant_limit"))
    assert isinstance(error, TenantLimitExceeded)
    assert error.type == "tenant_limit"
    assert error.message == "tenant 'acme' has 5 queued jobs, its limit is 5"
    assert error.retry_after_s == 6
    assert error.details == {"tenant_queued": 5, "limit": 5}


def test_result_retry_after_stays_between_one_and_five_seconds() -> None:
    assert admission.result_retry_after_s(
        running=True, estimated_wait_s=None, mean_service_s=0.2) == 1
    assert admission.result_retry_after_s(
        running=True, estimated_wait_s=None, mean_service_s=60) == 5
    assert admission.result_retry_after_s(
        running=False, estimated_wait_s=1.5, mean_service_s=1.0) == 3
    assert admission.result_retry_after_s(
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
