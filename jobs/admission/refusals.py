"""Admission: turn a "no" into a typed refusal with an honest ``Retry-After``.

Pure functions of their arguments (no I/O): the checks themselves are one atomic Lua call
each in Redis (the rate limiter, then the index's admit); this module explains a refusal to
the client, naming the limit (``limit``: bound, quota, rate or deadline) and by how much.

``Retry-After`` is the predicted time until the same submit would pass, in whole seconds,
at least 1, never a constant:

- ``capacity``/bound: the tier's queue has room when the pool has served
  ``tier_queued - bound + 1`` jobs at the service rate ``mu``.
- ``tenant_limit``/quota: the tenant's own queue drains at its concurrency cap over the
  mean service time, so one place frees after ``mean / cap``. At its cap, one frees when the
  first of its own running jobs ends: when that is, from what each has run against its
  kind's time (``jobs.core.remaining``; ``own_first_end_s``), once its kinds are measured.
- ``tenant_limit``/cap: the tier is at its bound while the pool has a free slot, and the
  tenant runs as many jobs as its cap allows: its next one starts when one of its own ends,
  after ``mean / cap``, or when the first of them is expected to end as above (the pool is
  not what holds it back, so the cause is never ``capacity``).
- ``tenant_limit``/rate: the time until its token bucket holds the next token.
- ``capacity``/deadline: the job would start after its own ``max_wait_s``, by the estimate of
  ``policy.expected_wait_s`` (the better-ranked work expected to arrive meanwhile counted).
  It would start in time once the queue ahead of it has shrunk to the latest useful
  position, after ``(position - max_position) / mu``, and once enough of the tenant's own
  jobs have finished to free a slot under its cap in time, after ``(excess - max_excess) /
  tenant_rate``: the later of the two that bind.

With nothing being served (``mu == 0``: no live workers) there is no drain time to give.
The message says so, and ``Retry-After`` is the worker registration period
(``idle_retry_s``): the time within which a starting worker has registered and a gone
one has dropped out, so a retry then meets the pool as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs.core.errors import CapacityExceeded, Refused, TenantLimitExceeded
from jobs.core.policy import (
    Overtaker,
    TenantLoad,
    latest_useful_excess,
    overtaken_wait_s,
    tenant_wait_s,
)

# The index's refusal reasons (``Admission.reason``) as a 429 names them: (cause, limit).
REFUSAL_NAMES = {
    "capacity": ("capacity", "bound"),
    "deadline": ("capacity", "deadline"),
    "tenant_limit": ("tenant_limit", "quota"),
    "rate": ("tenant_limit", "rate"),
    "cap": ("tenant_limit", "cap"),
}


def cause_and_limit(reason: str) -> tuple[str, str]:
    """The cause and limit of an index refusal (an unknown reason is ours: capacity)."""
    return REFUSAL_NAMES.get(reason, ("capacity", reason))

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
    # The tenant's cap, jobs in flight and own jobs ahead (deadline; None: not known).
    tenant_load: TenantLoad | None = None
    # The work expected to arrive and pass the job while it waits (deadline).
    later: tuple[Overtaker, ...] = ()
    # When the first of the tenant's own running jobs is expected to end, from what each has
    # run (quota and cap at its cap; None: as fresh jobs, at ``tenant_rate``).
    own_first_end_s: float | None = None


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


def tenant_retry_after_s(
    *, tenant_rate: float, idle_retry_s: float, first_end_s: float | None = None
) -> int:
    """Seconds until the tenant's own queue drains by one job at its cap: when the first of
    its running jobs is expected to end (``first_end_s``), else one job at its rate."""
    if tenant_rate <= 0:
        return whole_seconds(idle_retry_s)
    return whole_seconds(1 / tenant_rate if first_end_s is None else first_end_s)


def deadline_retry_after_s(*, position: int, max_position: int, service_rate: float) -> int:
    """Seconds until a job at ``position`` would be at ``max_position``: the queue ahead
    drains at ``mu``."""
    if service_rate <= 0:
        return MAX_RETRY_AFTER_S
    return whole_seconds(max(1, position - max_position) / service_rate)


def tenant_deadline_retry_after_s(*, excess: int, max_excess: int, tenant_rate: float) -> int:
    """Seconds until a tenant ``excess`` jobs over its cap is at ``max_excess``: its own jobs
    finish at ``tenant_rate``."""
    if tenant_rate <= 0:
        return MAX_RETRY_AFTER_S
    return whole_seconds(max(1, excess - max_excess) / tenant_rate)


def refused(refusal: Refusal) -> Refused:
    """The exception to raise for the index's refusal (the API maps it to a 429)."""
    if refusal.reason == "tenant_limit":
        return _quota(refusal)
    if refusal.reason == "cap":
        return _cap(refusal)
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
            tenant_rate=r.tenant_rate, idle_retry_s=r.idle_retry_s,
            first_end_s=r.own_first_end_s,
        ),
        limit="quota",
        tenant_queued=r.tenant_queued,
        quota=r.quota,
    )


def _cap(r: Refusal) -> TenantLimitExceeded:
    load = r.tenant_load
    running = 0 if load is None else load.inflight
    cap = 0 if load is None else load.cap
    message = (f"tenant {r.tenant_name!r} runs {running} jobs, its cap of {cap}, and tier "
               f"{r.tier!r} is at its bound of {r.bound} queued jobs, which wait on their "
               f"tenants' caps while the pool has {r.free_slots} free slot(s)")
    return TenantLimitExceeded(
        message,
        tier=r.tier,
        queue_position=r.position,
        retry_after_s=tenant_retry_after_s(
            tenant_rate=r.tenant_rate, idle_retry_s=r.idle_retry_s,
            first_end_s=r.own_first_end_s,
        ),
        limit="cap",
        tenant_inflight=running,
        tenant_cap=cap,
        tier_queued=r.tier_queued,
        bound=r.bound,
    )


def _deadline(r: Refusal) -> CapacityExceeded:
    if r.max_wait_s is None:
        raise ValueError("a deadline refusal needs max_wait_s")
    pool_wait = overtaken_wait_s(r.position + 1 - r.free_slots, r.service_rate, r.later)
    load = r.tenant_load
    own_wait = 0.0 if load is None else tenant_wait_s(load, r.tenant_rate)
    estimate = max(pool_wait, own_wait)
    details: dict[str, float | int] = {}
    if load is not None and own_wait > pool_wait:
        message = (f"tenant {r.tenant_name!r} has {load.inflight} running and {load.ahead} "
                   f"queued jobs at its cap of {load.cap}: this job would start in about "
                   f"{whole_seconds(estimate)} s, later than its max_wait_s of "
                   f"{r.max_wait_s:g} s")
        details = {"tenant_cap": load.cap, "tenant_inflight": load.inflight,
                   "tenant_queued_ahead": load.ahead}
    else:
        message = (f"tier {r.tier!r} would start this job in about {whole_seconds(estimate)} s, "
                   f"later than its max_wait_s of {r.max_wait_s:g} s")
    return CapacityExceeded(
        message,
        tier=r.tier,
        queue_position=r.position,
        retry_after_s=_deadline_retry_after_s(r, r.max_wait_s),
        limit="deadline",
        estimated_wait_s=round(estimate, 3),
        max_wait_s=r.max_wait_s,
        **details,
    )


def _deadline_retry_after_s(r: Refusal, max_wait_s: float) -> int:
    """The later of the pool's and the tenant's times to fit ``max_wait_s``, of those that
    bind; at least 1 s."""
    waits = [1]
    if r.max_position is not None and r.position > r.max_position:
        waits.append(deadline_retry_after_s(
            position=r.position, max_position=r.max_position, service_rate=r.service_rate))
    max_excess = latest_useful_excess(max_wait_s, r.tenant_rate)
    load = r.tenant_load
    if load is not None and max_excess is not None and load.excess > max_excess:
        waits.append(tenant_deadline_retry_after_s(
            excess=load.excess, max_excess=max_excess, tenant_rate=r.tenant_rate))
    return max(waits)


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
