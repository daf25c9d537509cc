"""Admission: turn the index's answer into a typed refusal with an honest ``Retry-After``.

Pure functions of their arguments (no I/O): the bound check itself is one atomic Lua call in
the index; this module only explains a "no" to the client.

- ``capacity``: the tier's queue is at its bound. A slot in it frees when the pool has served
  ``tier_queued - bound + 1`` jobs at the service rate ``mu``.
- ``tenant_limit``: the tenant holds its whole queued quota. Its own queue drains at its
  concurrency cap over the mean service time, so one place frees after ``mean / cap``.

With nothing being served (``mu == 0``: no live workers) there is no drain time to give; the
tier's ``max_wait_s`` stands in, the longest wait that tier would accept anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs.errors import CapacityExceeded, Refused, TenantLimitExceeded

# Longest Retry-After we ever advise: beyond this a client should look at /v1/queues.
MAX_RETRY_AFTER_S = 3600


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """What the index said when it refused, and the figures needed to explain it."""

    reason: str  # "capacity" or "tenant_limit"
    tier: str
    tenant_name: str
    position: int
    tier_queued: int
    tenant_queued: int
    bound: int
    quota: int
    service_rate: float  # mu, jobs/s over the pool
    tenant_rate: float  # jobs/s this tenant's cap lets it finish
    fallback_s: float  # used when nothing is being served


def _whole_seconds(seconds: float) -> int:
    if not math.isfinite(seconds):
        return MAX_RETRY_AFTER_S
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds - 1e-9)))


def capacity_retry_after_s(
    *, tier_queued: int, bound: int, service_rate: float, fallback_s: float
) -> int:
    """Seconds until one place frees in a full tier: ``(queued - bound + 1) / mu``."""
    if service_rate <= 0:
        return _whole_seconds(fallback_s)
    excess = max(1, tier_queued - bound + 1)
    return _whole_seconds(excess / service_rate)


def tenant_retry_after_s(*, tenant_rate: float, fallback_s: float) -> int:
    """Seconds until the tenant's own queue drains by one job at its cap."""
    if tenant_rate <= 0:
        return _whole_seconds(fallback_s)
    return _whole_seconds(1 / tenant_rate)


def tenant_rate(*, cap: int, capacity: int, mean_service_s: float) -> float:
    """Jobs/s one tenant can finish: its cap (never more than the pool) over the mean time."""
    if capacity <= 0 or mean_service_s <= 0:
        return 0.0
    return min(cap, capacity) / mean_service_s


def refused(refusal: Refusal) -> Refused:
    """The exception to raise for this refusal (the API maps it to a 429)."""
    if refusal.reason == "tenant_limit":
        return TenantLimitExceeded(
            f"tenant {refusal.tenant_name!r} has {refusal.tenant_queued} queued jobs, "
            f"its limit is {refusal.quota}",
            tier=refusal.tier,
            queue_position=refusal.position,
            retry_after_s=tenant_retry_after_s(
                tenant_rate=refusal.tenant_rate, fallback_s=refusal.fallback_s
            ),
            tenant_queued=refusal.tenant_queued,
            limit=refusal.quota,
        )
    return CapacityExceeded(
        f"tier {refusal.tier!r} is at its bound of {refusal.bound} queued jobs",
        tier=refusal.tier,
        queue_position=refusal.position,
        retry_after_s=capacity_retry_after_s(
            tier_queued=refusal.tier_queued,
            bound=refusal.bound,
            service_rate=refusal.service_rate,
            fallback_s=refusal.fallback_s,
        ),
        tier_queued=refusal.tier_queued,
        bound=refusal.bound,
    )


def result_retry_after_s(
    *, running: bool, estimated_wait_s: float | None, mean_service_s: float
) -> int:
    """``Retry-After`` for a result that is not ready: the expected time to it, 1..5 s."""
    if running:
        expected = mean_service_s
    elif estimated_wait_s is None or not math.isfinite(estimated_wait_s):
        expected = 5.0
    else:
        expected = estimated_wait_s + mean_service_s
    return min(5, max(1, math.ceil(expected)))
