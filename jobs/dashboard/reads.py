"""The dashboard's reads: the live index figures, the recent waits and refusals, and a few
bounded SQL queries, handed to the pure ``jobs.dashboard.figures``.

What one refresh costs:

- fleet: the reads of ``/v1/queues`` (``jobs.fleet.metrics``: a few Redis round trips and one
  indexed query per tier), the refusal counts (one round trip), every lease's tenant (as
  many leases as the pool has slots), the queued counts of the tenants shown (at most
  ``NEAREST_TENANTS``) and their records (one query by primary key);
- tenant: the same index figures, its tier's recent waits (one indexed query), its own
  in-flight and queued counts, and its latest ``TENANT_JOBS`` jobs (one query on
  ``(tenant_id, id)``), from which its own waits, its jobs by status and its recent jobs are
  all taken.
"""

from __future__ import annotations

from jobs.core.domain import Tenant
from jobs.dashboard import figures, refusals
from jobs.fleet.metrics import WAIT_WINDOW_S, read_index_view, recent_waits
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from jobs.store import tenants as tenants_sql

TENANT_JOBS = 500


def fleet(runtime: Runtime) -> figures.FleetView:
    now = runtime.clock()
    view = read_index_view(runtime, now=now)
    waits = recent_waits(runtime, now=now)
    recent = refusals.read_recent(runtime.index, now=now, window_s=WAIT_WINDOW_S)
    inflight = runtime.index.inflight_by_tenant()
    with runtime.sessions() as session:
        holding = tenants_sql.tenants_by_ids(session, inflight)
    shown = figures.nearest_cap(holding, inflight, view.pool)
    uses = [
        figures.tenant_use(holding[tenant_id], view.pool, inflight=inflight[tenant_id],
                           queued=runtime.index.tenant_queued(tenant_id))
        for tenant_id in shown
    ]
    return figures.fleet_view(runtime.policy, at=now, window_s=WAIT_WINDOW_S, view=view,
                              waits=waits, refusals=recent.by_tier, tenants=uses,
                              workers=runtime.index.live_workers(now=now))


def of_tenant(runtime: Runtime, tenant: Tenant) -> figures.TenantView:
    now = runtime.clock()
    view = read_index_view(runtime, now=now)
    recent = refusals.read_recent(runtime.index, now=now, window_s=WAIT_WINDOW_S)
    card = None
    with runtime.sessions() as session:
        jobs = jobs_sql.latest_jobs(session, tenant_id=tenant.id, limit=TENANT_JOBS)
        for tier in view.tiers:
            if tier.name == tenant.tier:  # absent only when its tier left the configuration
                waits = stats_sql.recent_waits(session, tier=tier.name,
                                                since=now - WAIT_WINDOW_S)
                card = figures.tier_card(runtime.policy, tier, waits,
                                         recent.of_tenant(tenant.id))
    use = figures.tenant_use(tenant, view.pool, inflight=runtime.index.tenant_inflight(tenant.id),
                             queued=runtime.index.tenant_queued(tenant.id))
    return figures.tenant_view(at=now, window_s=WAIT_WINDOW_S, tier=card, use=use, jobs=jobs)
