"""The limits a submit passes before its row is written, in this order:

1. the tenant's request rate: a token bucket in Redis (``jobs.index.rate_limit``), the
   tier's ``rate_per_s``/``rate_burst`` or the tenant's own; over it, ``tenant_limit``;
2. a job with its own ``max_wait_s`` that would wait longer than that for a slot under its
   tenant's cap (its jobs in flight and queued, ``policy.latest_useful_excess``) is refused
   (``capacity``, limit ``deadline``) whatever room the pool has. Checked in Python from two
   reads just before the admit: a race with a finish or a submit of the same tenant moves
   the estimate by a job at most, which an estimate can bear;
3. the index's admit, one atomic Lua call: the tier's bound (``capacity``), the tenant's
   queued quota (``tenant_limit``), and the job's own ``max_wait_s``: a job whose predicted
   start is already later than that is refused (``capacity``) rather than accepted now and
   expired unserved later. The check is a position: the latest place in the queue from
   which the job is still expected to start in time (``policy.latest_useful_position``).

Each refusal leaves nothing behind (a rate refusal only spends the token it was refused
for) and carries a ``Retry-After`` from ``jobs.admission``. An accepted job gets its
place and its estimate (``jobs.estimates``).
"""

from __future__ import annotations

import logging

from jobs import estimates, policy
from jobs.admission import Refusal, idle_retry_s, rate_refused, refused
from jobs.capacity import PoolFigures
from jobs.domain import NewJob, Tenant
from jobs.estimates import Placement
from jobs.index.base import IndexedJob
from jobs.index.rate_limit import RateLimiter
from jobs.runtime import Runtime

logger = logging.getLogger(__name__)


def check_rate(runtime: Runtime, tenant: Tenant, new: NewJob) -> None:
    """Take a token from the tenant's bucket; refuse (``tenant_limit``) when it is empty."""
    limit = policy.rate_limit(
        runtime.policy.tier(new.tier), rate_per_s=tenant.rate_per_s, burst=tenant.rate_burst
    )
    if limit is None:
        return
    limiter = RateLimiter(runtime.redis, runtime.settings.key_prefix)
    decision = limiter.take(
        tenant.id, rate_per_s=limit.rate_per_s, burst=limit.burst, now=new.enqueued_at
    )
    if decision.allowed:
        return
    _log_refusal(tenant, new.tier, "tenant_limit", "rate")
    raise rate_refused(
        tier=new.tier,
        tenant_name=tenant.name,
        position=runtime.index.position_at(new.order_key),
        rate_per_s=limit.rate_per_s,
        burst=limit.burst,
        next_token_s=decision.retry_after_s,
    )


def admit(runtime: Runtime, tenant: Tenant, new: NewJob, figures: PoolFigures) -> Placement:
    """Index the job under the tier's bound, the tenant's quota and its own deadline; its
    place in the queue (jobs ahead of it) and its estimated wait."""
    tier = new.tier
    cap = estimates.tenant_cap(tenant, figures)
    # Read before the atomic admit, so a concurrent finish or submit of this tenant may move
    # it by a job: good enough for an estimate (the bound and the quota stay exact).
    inflight = runtime.index.tenant_inflight(tenant.id)
    max_position = None
    if new.max_wait_s is not None:
        max_position = policy.latest_useful_position(
            new.max_wait_s, figures.free_slots, figures.service_rate
        )
        own = policy.TenantLoad(cap=cap, inflight=inflight,
                                ahead=runtime.index.tenant_queued(tenant.id))
        _check_own_deadline(runtime, tenant, new, figures, own, new.max_wait_s, max_position)
    admitted = runtime.index.admit(
        IndexedJob(
            job_id=new.id, tenant=tenant.id, tier=tier, order_key=new.order_key,
            start_by=new.start_by,
        ),
        bound=figures.bounds[tier],
        tenant_quota=_quota(tenant, figures, tier),
        max_position=max_position,
    )
    if admitted.accepted:
        load = policy.TenantLoad(cap=cap, inflight=inflight,
                                 ahead=max(0, admitted.tenant_queued - 1))
        return estimates.placement(figures, position=admitted.position, load=load)
    reason = admitted.reason or "capacity"
    _log_refusal(tenant, tier, "tenant_limit" if reason == "tenant_limit" else "capacity",
                 {"capacity": "bound", "tenant_limit": "quota"}.get(reason, reason))
    raise refused(_refusal(
        runtime, tenant, new, figures, reason=reason, position=admitted.position,
        tier_queued=admitted.tier_queued, max_position=max_position,
        load=policy.TenantLoad(cap=cap, inflight=inflight, ahead=admitted.tenant_queued),
    ))


def _check_own_deadline(
    runtime: Runtime, tenant: Tenant, new: NewJob, figures: PoolFigures,
    load: policy.TenantLoad, max_wait_s: float, max_position: int | None,
) -> None:
    """Refuse (``deadline``) a job that would wait longer than its ``max_wait_s`` for a slot
    under its tenant's own cap, whatever room the pool has; the pool's side is the admit
    script's. Nothing served (no rate): no estimate to refuse on, as for the pool."""
    max_excess = policy.latest_useful_excess(max_wait_s, estimates.tenant_rate(tenant, figures))
    if max_excess is None or load.excess <= max_excess:
        return
    _log_refusal(tenant, new.tier, "capacity", "deadline")
    tier_queued = runtime.index.tier_depths([new.tier])[new.tier].queued
    raise refused(_refusal(
        runtime, tenant, new, figures, reason="deadline",
        position=runtime.index.position_at(new.order_key), tier_queued=tier_queued,
        max_position=max_position, load=load,
    ))


def _refusal(
    runtime: Runtime, tenant: Tenant, new: NewJob, figures: PoolFigures, *, reason: str,
    position: int, tier_queued: int, max_position: int | None, load: policy.TenantLoad,
) -> Refusal:
    return Refusal(
        reason=reason,
        tier=new.tier,
        tenant_name=tenant.name,
        position=position,
        tier_queued=tier_queued,
        tenant_queued=load.ahead,
        bound=figures.bounds[new.tier],
        quota=_quota(tenant, figures, new.tier),
        service_rate=figures.service_rate,
        tenant_rate=estimates.tenant_rate(tenant, figures),
        idle_retry_s=idle_retry_s(runtime.policy.lease_ttl_s),
        max_wait_s=new.max_wait_s,
        max_position=max_position,
        free_slots=figures.free_slots,
        tenant_load=load,
    )


def _quota(tenant: Tenant, figures: PoolFigures, tier: str) -> int:
    return tenant.max_queued if tenant.max_queued is not None else figures.quotas[tier]


def _log_refusal(tenant: Tenant, tier: str, cause: str, limit: str) -> None:
    logger.info("job.refused", extra={"event": "job.refused", "tenant": tenant.id,
                                      "tier": tier, "reason": cause, "limit": limit})
