"""Admission: turn a "no" into a typed refusal with an honest ``Retry-After``.

Pure functions of their arguments (no I/O): the checks themselves are one atomic Lua call
each in Redis (the rate limiter, then the index's admit); this module explains a refusal to
the client, naming the limit (``limit``: bound, quota, rate or deadline) and by how much.

``Retry-After`` is the predicted time until the same submit would pass, in whole seconds,
at least 1, never a constant:

- ``capacity``/bound: the tier's queue has room when the pool has served
  ``tier_queued - bound + 1`` jobs at the service rate ``mu``.
- ``tenant_limit``/quota: the tenant's own queue drains at its concurrency cap over the
  mean service time, so one place frees after ``mean / cap``.
- ``tenant_limit``/rate: the time until its token bucket holds the next token.
- ``capacity``/deadline: the job would start after its own ``max_wait_s``; it would start in
  time once the queue ahead of it has shrunk to the latest useful position, i.e. after
  ``(position - max_position) / mu``.

With nothing being served (``mu == 0``: no live workers) there is no drain time to give.
The message says so, and ``Retry-After`` is the worker registration period
(``idle_retry_s``): the time within which a starting worker has registered and a gone
one has dropped out, so a retry then meets the pool as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs.errors import CapacityExceeded, Refused, TenantLimitExceeded
from jobs.policy import estimated_wait_s

# Longest Retry-After we ever advise: beyond this a client should look at /v1/queues.
MAX_RETRY_AFTER_S = 3600
# Shortest worker registration period (see workers/registration.py).
MIN_REGISTRATION_S = 3.0
_IDLE = "; no workers are serving"


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """What the index said when it refused, and the figures needed to explain it."""

    reason: str  # "capacity", "tenant_limit" or "deadline"
    tier: str
    tenant_name: str
    position: int
    tier_queued: int
    tenant_queued: int
    bound: int
    quota: int
    service_rate: float  # mu, jobs/s over the pool
    tenant_rate: float  # jobs/s this tenant's cap lets it finish
    idle_retry_s: float  # Retry-After when nothing is being served
    max_wait_s: float | None = None  # the job's own (deadline)
    max_position: int | None = None  # the latest useful position for it (deadline)
    free_slots: int = 0


def idle_retry_s(lease_ttl_s: float) -> float:
    """The worker registration period: ``max(3 s, lease_ttl_s)``."""
    return max(MIN_REGISTRATION_S, lease_ttl_s)


def whole_seconds(seconds: float) -> int:
    """A ``Retry-After``: whole seconds rounded up, at least 1, at most an hour."""
    if not math.isfinite(seconds):
        return MAX_RETRY_AFTER_S
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds - 1e-9)))


def capacity_retry_after_s(
    *, tier_queued: int, bound: int, service_rate: float, idle_retry_s: float
) -> int:
    """Seconds until one place frees in a full tier: ``(queued - bound + 1) / mu``."""
    if service_rate <= 0:
        return whole_seconds(idle_retry_s)
    excess = max(1, tier_queued - bound + 1)
    return whole_seconds(excess / service_rate)


def tenant_retry_after_s(*, tenant_rate: float, idle_retry_s: float) -> int:
    """Seconds until the tenant's own queue drains by one job at its cap."""
    if tenant_rate <= 0:
        return whole_seconds(idle_retry_s)
    return whole_seconds(1 / tenant_rate)


def deadline_retry_after_s(*, position: int, max_position: int, service_rate: float) -> int:
    """Seconds until a job at ``position`` would be at ``max_position``: the queue ahead
    drains at ``mu``."""
    if service_rate <= 0:
        return MAX_RETRY_AFTER_S
    return whole_seconds(max(1, position - max_position) / service_rate)


def tenant_rate(*, cap: int, capacity: int, mean_service_s: float) -> float:
    """Jobs/s one tenant can finish: its cap (never more than the pool) over the mean time."""
    if capacity <= 0 or mean_service_s <= 0:
        return 0.0
    return min(cap, capacity) / mean_service_s


def refused(refusal: Refusal) -> Refused:
    """The exception to raise for the index's refusal (the API maps it to a 429)."""
    if refusal.reason == "tenant_limit":
        return _quota(refusal)
    if refusal.reason == "deadline":
        return _deadline(refusal)
    return _bound(refusal)


def _bound(r: Refusal) -> CapacityExceeded:
    if r.tier_queued > r.bound:
        message = (f"tier {r.tier!r} has {r.tier_queued} queued jobs, "
                   f"{r.tier_queued - r.bound} over its bound of {r.bound}")
    else:
        message = f"tier {r.tier!r} is at its bound of {r.bound} queued jobs"
    return CapacityExceeded(
        message + (_IDLE if r.service_rate <= 0 else ""),
        tier=r.tier,
        queue_position=r.position,
        retry_after_s=capacity_retry_after_s(
            tier_queued=r.tier_queued, bound=r.bound, service_rate=r.service_rate,
            idle_retry_s=r.idle_retry_s,
        ),
        limit="bound",
        tier_queued=r.tier_queued,
        bound=r.bound,
    )


def _quota(r: Refusal) -> TenantLimitExceeded:
    message = (f"tenant {r.tenant_name!r} has {r.tenant_queued} queued jobs, "
               f"its limit is {r.quota}")
    return TenantLimitExceeded(
        message + (_IDLE if r.tenant_rate <= 0 else ""),
        tier=r.tier,
        queue_position=r.position,
        retry_after_s=tenant_retry_after_s(
            tenant_rate=r.tenant_rate, idle_retry_s=r.idle_retry_s
        ),
        limit="quota",
        tenant_queued=r.tenant_queued,
        quota=r.quota,
    )


def _deadline(r: Refusal) -> CapacityExceeded:
    if r.max_wait_s is None or r.max_position is None:
        raise ValueError("a deadline refusal needs max_wait_s and max_position")
    estimate = estimated_wait_s(r.position, r.free_slots, r.service_rate)
    return CapacityExceeded(
        f"tier {r.tier!r} would start this job in about {whole_seconds(estimate)} s, "
        f"later than its max_wait_s of {r.max_wait_s:g} s",
        tier=r.tier,
        queue_position=r.position,
        retry_after_s=deadline_retry_after_s(
            position=r.position, max_position=r.max_position, service_rate=r.service_rate
        ),
        limit="deadline",
        estimated_wait_s=round(estimate, 3),
        max_wait_s=r.max_wait_s,
    )


def rate_refused(
    *, tier: str, tenant_name: str, position: int, rate_per_s: float, burst: int,
    next_token_s: float,
) -> TenantLimitExceeded:
    """The refusal of a submit over the tenant's request rate."""
    return TenantLimitExceeded(
        f"tenant {tenant_name!r} is over its rate of {rate_per_s:g} submits/s",
        tier=tier,
        queue_position=position,
        retry_after_s=whole_seconds(next_token_s),
        limit="rate",
        rate_per_s=rate_per_s,
        burst=burst,
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
