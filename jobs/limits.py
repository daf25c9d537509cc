"""The limits a submit passes before its row is written, in this order:

1. the tenant's request rate: a token bucket in Redis (``jobs.index.rate_limit``), the
   tier's ``rate_per_s``/``rate_burst`` or the tenant's own; over it, ``tenant_limit``;
2. the index's admit, one atomic Lua call: the tier's bound (``capacity``), the tenant's
   queued quota (``tenant_limit``), and the job's own ``max_wait_s``: a job whose predicted
   start is already later than that is refused (``capacity``) rather than accepted now and
   expired unserved later. The check is a position: the latest place in the queue from
   which the job is still expected to start in time (``policy.latest_useful_position``).

Either refusal leaves nothing behind (a rate refusal only spends the token it was refused
for) and carries a ``Retry-After`` from ``jobs.admission``.
"""

from __future__ import annotations

import logging

from jobs import policy
from jobs.admission import Refusal, idle_retry_s, rate_refused, refused, tenant_rate
from jobs.capacity import PoolFigures
from jobs.domain import NewJob, Tenant
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


def admit(runtime: Runtime, tenant: Tenant, new: NewJob, figures: PoolFigures) -> int:
    """Index the job under the tier's bound, the tenant's quota and its own deadline; its
    queue position (jobs ahead of it)."""
    tier = new.tier
    quota = tenant.max_queued if tenant.max_queued is not None else figures.quotas[tier]
    max_position = None
    if new.max_wait_s is not None:
        max_position = policy.latest_useful_position(
            new.max_wait_s, figures.free_slots, figures.service_rate
        )
    admitted = runtime.index.admit(
        IndexedJob(
            job_id=new.id, tenant=tenant.id, tier=tier, order_key=new.order_key,
            start_by=new.start_by,
        ),
        bound=figures.bounds[tier],
        tenant_quota=quota,
        max_position=max_position,
    )
    if admitted.accepted:
        return admitted.position
    reason = admitted.reason or "capacity"
    _log_refusal(tenant, tier, "tenant_limit" if reason == "tenant_limit" else "capacity",
                 {"capacity": "bound", "tenant_limit": "quota"}.get(reason, reason))
    cap = tenant.cap if tenant.cap is not None else figures.caps[tier]
    raise refused(
        Refusal(
            reason=reason,
            tier=tier,
            tenant_name=tenant.name,
            position=admitted.position,
            tier_queued=admitted.tier_queued,
            tenant_queued=admitted.tenant_queued,
            bound=figures.bounds[tier],
            quota=quota,
            service_rate=figures.service_rate,
            tenant_rate=tenant_rate(
                cap=cap, capacity=figures.capacity, mean_service_s=figures.mean_service_s
            ),
            idle_retry_s=idle_retry_s(runtime.policy.lease_ttl_s),
            max_wait_s=new.max_wait_s,
            max_position=max_position,
            free_slots=figures.free_slots,
        )
    )


def _log_refusal(tenant: Tenant, tier: str, cause: str, limit: str) -> None:
    logger.info("job.refused", extra={"event": "job.refused", "tenant": tenant.id,
                                      "tier": tier, "reason": cause, "limit": limit})
