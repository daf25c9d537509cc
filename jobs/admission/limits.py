"""The limits a submit passes before its row is written, all checked by one atomic call to
the index (``DispatchIndex.admit_new``, one Redis round trip), in this order:

1. the tenant's request rate: a token bucket (``jobs.index.rate_limit``), the tier's
   ``rate_per_s``/``rate_burst`` or the tenant's own; over it, ``tenant_limit``;
2. a job with its own ``max_wait_s`` that would wait longer than that for a slot under its
   tenant's cap (its jobs in flight and queued, ``policy.latest_useful_excess``) is refused
   (``capacity``, limit ``deadline``) whatever room the pool has;
3. the admit: the tier's bound (``capacity``), the tenant's queued quota
   (``tenant_limit``), and the job's own ``max_wait_s``: a job whose predicted start is
   already later than that is refused (``capacity``) rather than accepted now and expired
   unserved later. The check is a position: the latest place in the queue from which the
   job is still expected to start in time (``policy.latest_useful_position``), counting the
   better-ranked work expected to arrive and pass it meanwhile (``policy.passing_jobs``).

The bounds follow from the pool's live figures (capacity, leases, measured mean service
time), read in that same call, so they are the figures of the moment of the decision; the
index derives them as ``jobs.core.policy`` does and returns them, and the refusal is explained
from them here.

Each refusal leaves nothing behind (a rate refusal only spends the token it was refused
for) and carries a ``Retry-After`` from ``jobs.admission.refusals``. An accepted job gets its
place and its estimate (``jobs.admission.estimates``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from jobs.admission import estimates
from jobs.admission.estimates import Placement
from jobs.admission.refusals import Refusal, cause_and_limit, idle_retry_s, rate_refused, refused
from jobs.core import policy
from jobs.core.arrivals import Work
from jobs.core.domain import NewJob, Tenant
from jobs.core.policy import MeasuredMean
from jobs.fleet import pool
from jobs.fleet.arrivals import read_work
from jobs.fleet.pool import PoolFigures
from jobs.index.base import Admission, AdmissionTerms, IndexedJob
from jobs.process.runtime import Runtime

logger = logging.getLogger(__name__)


def admit(runtime: Runtime, tenant: Tenant, new: NewJob) -> Placement:
    """Take the tenant's token and index the job under the tier's bound, the tenant's quota
    and its own deadline, in one call to the index; its place in the queue (jobs ahead of
    it) and its estimated wait. Raises the typed refusal (``Refused``)."""
    work = read_work(runtime.index)
    admit_terms = terms(runtime, tenant, new, work)
    admission = runtime.index.admit_new(
        IndexedJob(job_id=new.id, tenant=tenant.id, tier=new.tier, order_key=new.order_key,
                   start_by=new.start_by),
        admit_terms,
    )
    rate = admit_terms.rate
    if admission.reason == "rate" and rate is not None:
        _log_refusal(tenant, new.tier, "tenant_limit", "rate")
        raise rate_refused(
            tier=new.tier, tenant_name=tenant.name, position=admission.position,
            rate_per_s=rate.rate_per_s, burst=rate.burst, next_token_s=admission.next_token_s,
        )
    figures = pool_figures(runtime, admission)
    later = estimates.overtaking(runtime, work, order_key=new.order_key, now=new.enqueued_at)
    cap = estimates.tenant_cap(tenant, figures)
    if admission.accepted:
        load = policy.TenantLoad(cap=cap, inflight=admission.tenant_inflight,
                                 ahead=max(0, admission.tenant_queued - 1))
        own = (estimates.own_side(runtime, tenant, work, holds=load.inflight, cap=cap,
                                  now=new.enqueued_at)
               if load.excess else estimates.NOTHING_OWN)
        placed = estimates.placement(figures, position=admission.position, load=load,
                                     later=later, work=work, own=own,
                                     ahead=admission.starts_ahead)
        return replace(placed, slot_free=admission.inflight < admission.capacity)
    reason = admission.reason or "capacity"
    _log_refusal(tenant, new.tier, *cause_and_limit(reason))
    load = policy.TenantLoad(cap=cap, inflight=admission.tenant_inflight,
                             ahead=admission.tenant_queued)
    # A tenant over its own limit (its queued quota, its cap) is let in again once one of
    # its own running jobs ends: when, from what each has run.
    own = (estimates.own_side(runtime, tenant, work, holds=load.inflight, cap=cap,
                              now=new.enqueued_at)
           if reason in ("tenant_limit", "cap") and load.inflight >= cap
           else estimates.NOTHING_OWN)
    raise refused(_refusal(
        runtime, tenant, new, figures, reason=reason, position=admission.position,
        tier_queued=admission.tier_queued, max_position=admission.max_position,
        load=load, later=later, own_first_end_s=own.first_end_s,
    ))


def terms(
    runtime: Runtime, tenant: Tenant, new: NewJob, work: Work | None = None
) -> AdmissionTerms:
    """What the index admits ``new`` under: the policy, the tenant's overrides, the job's
    own deadline and the work the tiers' arrivals will pass it with before then (in jobs of
    the pool's mean). ``now`` is the job's enqueue time, on the one clock."""
    pol = runtime.policy
    passing = 0.0
    if new.max_wait_s is not None and work is not None and work.arrivals:
        later = policy.overtakers(pol.tiers, pol.ageing_rate_s, order_key=new.order_key,
                                  now=new.enqueued_at, arrivals=work.later_rates())
        passing = policy.passing_jobs(later, new.max_wait_s)
    return AdmissionTerms(
        now=new.enqueued_at,
        tier=pol.tier(new.tier),
        mean_service_s=pol.mean_service_s,
        service_samples_min=pol.service_samples_min,
        client_timeout_s=pol.client_timeout_s,
        pool_concurrency=pol.pool_concurrency,
        rate=policy.rate_limit(pol.tier(new.tier), rate_per_s=tenant.rate_per_s,
                               burst=tenant.rate_burst),
        tenant_cap=tenant.cap,
        tenant_quota=tenant.max_queued,
        max_wait_s=new.max_wait_s,
        passing=passing,
    )


def pool_figures(runtime: Runtime, admission: Admission) -> PoolFigures:
    """The pool's figures as the index read them for the admission (``pool.figures``
    derives the same bounds from them as the index did)."""
    measured = None
    if admission.measured is not None:
        mean_s, samples = admission.measured
        measured = MeasuredMean(mean_s=mean_s, samples=samples)
    return pool.figures(runtime.policy, capacity=admission.capacity,
                            inflight=admission.inflight, measured=measured)


def _refusal(
    runtime: Runtime, tenant: Tenant, new: NewJob, figures: PoolFigures, *, reason: str,
    position: int, tier_queued: int, max_position: int | None, load: policy.TenantLoad,
    later: Sequence[policy.Overtaker], own_first_end_s: float | None = None,
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
        later=tuple(later),
        own_first_end_s=own_first_end_s,
    )


def _quota(tenant: Tenant, figures: PoolFigures, tier: str) -> int:
    return tenant.max_queued if tenant.max_queued is not None else figures.quotas[tier]


def _log_refusal(tenant: Tenant, tier: str, cause: str, limit: str) -> None:
    logger.info("job.refused", extra={"event": "job.refused", "tenant": tenant.id,
                                      "tier": tier, "reason": cause, "limit": limit})
