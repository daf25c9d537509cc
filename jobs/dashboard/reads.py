"""The dashboard's reads: the live index figures, the recent waits and refusals, and a few
bounded SQL queries, handed to the pure ``jobs.dashboard.figures``.

The tier cards are the default pool's (``jobs.core.pools``); the refusals, the pool
figures, live workers, tenants' caps and in-flight counts are read in every pool, each under
its own keys. What one refresh costs:

- fleet: the reads of ``/v1/queues`` (``jobs.fleet.metrics``: a few Redis round trips per
  pool and one indexed query per tier), the refusal counts (one round trip per pool), every
  lease's tenant in each pool (as many leases as the pools have slots), the queued counts of
  the tenants shown (at most ``NEAREST_TENANTS`` per pool) and their records (one query by
  primary key for all pools), and the runs' figures (two round trips per pool, O(kinds));
- tenant: the same index figures, its tier's recent waits (one indexed query), its own
  in-flight and queued counts in each pool, and its latest ``TENANT_JOBS`` jobs (one query
  on ``(tenant_id, id)``), from which its own waits, its jobs by status and its recent jobs
  are all taken.
"""

from __future__ import annotations

from jobs.core.domain import Tenant
from jobs.dashboard import figures, refusals
from jobs.fleet.metrics import (
    ITEMS_WINDOW_S,
    WAIT_WINDOW_S,
    read_index_view,
    recent_waits,
    run_figures,
)
from jobs.fleet.pool import PoolFigures, live_pool
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from jobs.store import tenants as tenants_sql

TENANT_JOBS = 500


def fleet(runtime: Runtime) -> figures.FleetView:
    now = runtime.clock()
    pools = runtime.every_pool()
    home = pools[0]
    view = read_index_view(home, now=now)
    waits = recent_waits(home, now=now)
    recent = refusals.read_recent(*(one.index for one in pools), now=now,
                                   window_s=WAIT_WINDOW_S)
    lines = [
        figures.PoolLine(name=one.pool, kinds=figures.pool_kinds(one.pools, one.pool),
                         figures=view.pool if one is home else live_pool(one, now=now),
                         workers=one.index.live_workers(now=now))
        for one in pools
    ]
    inflight = [one.index.inflight_by_tenant() for one in pools]
    with home.sessions() as session:
        holding = tenants_sql.tenants_by_ids(
            session, {tenant_id for held in inflight for tenant_id in held})
    uses: list[figures.TenantUse] = []
    for one, line, held in zip(pools, lines, inflight, strict=True):
        found = {tenant_id: holding[tenant_id] for tenant_id in held if tenant_id in holding}
        uses.extend(
            figures.tenant_use(found[tenant_id], line.figures, inflight=held[tenant_id],
                               queued=one.index.tenant_queued(tenant_id), pool=one.pool)
            for tenant_id in figures.nearest_cap(found, held, line.figures))
    runs = figures.packing({one.pool: run_figures(one, now=now) for one in pools},
                           window_s=ITEMS_WINDOW_S)
    return figures.fleet_view(home.policy, at=now, window_s=WAIT_WINDOW_S, view=view,
                              waits=waits, refusals=recent.by_tier, tenants=uses, pools=lines,
                              runs=runs)


def of_tenant(runtime: Runtime, tenant: Tenant) -> figures.TenantView:
    now = runtime.clock()
    pools = runtime.every_pool()
    home = pools[0]
    view = read_index_view(home, now=now)
    recent = refusals.read_recent(*(one.index for one in pools), now=now,
                                   window_s=WAIT_WINDOW_S)
    card = None
    with home.sessions() as session:
        jobs = jobs_sql.latest_jobs(session, tenant_id=tenant.id, limit=TENANT_JOBS)
        for tier in view.tiers:
            if tier.name == tenant.tier:  # absent only when its tier left the configuration
                waits = stats_sql.recent_waits(session, tier=tier.name,
                                                since=now - WAIT_WINDOW_S)
                card = figures.tier_card(home.policy, tier, waits,
                                         recent.of_tenant(tenant.id))
    uses = []
    for one in pools:
        pool: PoolFigures = view.pool if one is home else live_pool(one, now=now)
        queued, inflight = one.index.tenant_counts(tenant.id)
        uses.append(figures.tenant_use(tenant, pool, pool=one.pool, inflight=inflight,
                                       queued=queued))
    return figures.tenant_view(at=now, window_s=WAIT_WINDOW_S, tier=card, use=uses[0],
                               pools=uses, jobs=jobs)
