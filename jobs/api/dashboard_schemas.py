"""The body of ``GET /v1/dashboard``: the fleet's view (admin key) or a tenant's own view."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from jobs.api.queue_schemas import PoolView, WorkerView
from jobs.api.schemas import TIMESTAMP, rfc3339
from jobs.core.states import Status
from jobs.dashboard.figures import (
    FleetView,
    JobLine,
    KindRuns,
    Packing,
    PoolItems,
    PoolLine,
    TenantUse,
    TenantView,
    TierCard,
)
from jobs.dashboard.refusals import RefusalCount


class RefusalTally(BaseModel):
    """Submits refused with a 429 in the window, of one cause and limit."""

    cause: str = Field(description="`capacity` (ours to fix) or `tenant_limit` (the client's)")
    limit: str = Field(description="the limit hit: `bound`, `deadline`, `quota`, `rate` or "
                       "`cap`")
    count: int = Field(description="refusals of this cause and limit in the window")

    @classmethod
    def of(cls, refusal: RefusalCount) -> RefusalTally:
        return cls(cause=refusal.cause, limit=refusal.limit, count=refusal.count)


class TierCardView(BaseModel):
    """One tier: its queue against its bound, its oldest job against its ageing guarantee,
    its recent waits against its max_wait_s, and its recent refusals."""

    name: str = Field(description="the tier")
    queued: int = Field(description="jobs queued in it now")
    bound: int = Field(description="queued jobs beyond which submits are refused (429 capacity)")
    oldest_age_s: float | None = Field(description="seconds its oldest queued job has waited; "
                                       "null when none is queued")
    ageing_guarantee_s: float = Field(description="seconds after which one of its jobs ties "
                                      "with fresh work of the best tier")
    max_wait_s: float = Field(description="the longest wait still useful to the tier")
    tenant_cap: int = Field(description="jobs one tenant of the tier may run at once")
    wait_p50_s: float | None = Field(description="median wait of its jobs that started in the "
                                     "window; null when none did")
    wait_p95_s: float | None = Field(description="95th percentile of the same waits")
    waits_counted: int = Field(description="jobs of the tier that started in the window")
    refusals: list[RefusalTally] = Field(description="its refusals in the window, in every "
                                         "pool, by cause and limit, most first (a tenant's "
                                         "view: its own only)")

    @classmethod
    def of(cls, card: TierCard) -> TierCardView:
        return cls(
            name=card.name, queued=card.queued, bound=card.bound, oldest_age_s=card.oldest_age_s,
            ageing_guarantee_s=card.ageing_guarantee_s, max_wait_s=card.max_wait_s,
            tenant_cap=card.tenant_cap, wait_p50_s=card.waits.p50_s,
            wait_p95_s=card.waits.p95_s, waits_counted=card.waits.count,
            refusals=[RefusalTally.of(r) for r in card.refusals],
        )


def pool_view(line: PoolLine) -> PoolView:
    """One pool's entry of ``pools``: ``/v1/queues``'s figures of it."""
    pool = line.figures
    return PoolView(name=line.name, kinds=line.kinds, live_workers=len(line.workers),
                    capacity=pool.capacity, inflight=pool.inflight,
                    utilisation=pool.utilisation, service_rate=pool.service_rate)


class PoolCard(PoolView):
    """A pool of workers: ``/v1/queues``'s figures, and what is behind them."""

    mean_service_s: float = Field(description="mean service time behind μ")
    service_measured: bool = Field(description="true when mean_service_s is measured from "
                                   "finished jobs, false while it is the configured fallback")
    workers: list[WorkerView] = Field(description="its live workers, by id")

    @classmethod
    def of(cls, line: PoolLine, *, now: float) -> PoolCard:
        pool = line.figures
        return cls(**pool_view(line).model_dump(), mean_service_s=pool.mean_service_s,
                   service_measured=pool.service_samples > 0,
                   workers=[WorkerView.of(w, now, line.name) for w in line.workers])


class TenantUseView(BaseModel):
    """A tenant's jobs in flight against its cap, and queued against its quota, in one pool."""

    name: str = Field(description="the tenant")
    tier: str = Field(description="its tier")
    inflight: int = Field(description="its jobs holding a slot now")
    cap: int = Field(description="its concurrency cap (its own, else its tier's)")
    cap_use: float = Field(description="inflight / cap")
    queued: int = Field(description="its jobs queued now (retry backoffs included)")
    quota: int = Field(description="queued jobs beyond which its submits are refused")
    quota_use: float = Field(description="queued / quota")
    pool: str = Field(default="default", description="the pool these figures are of: each "
                      "pool counts a tenant's jobs, and sizes its cap and quota, on its own")

    @classmethod
    def of(cls, use: TenantUse) -> TenantUseView:
        return cls(name=use.name, tier=use.tier, inflight=use.inflight, cap=use.cap,
                   cap_use=use.cap_use, queued=use.queued, quota=use.quota,
                   quota_use=use.quota_use, pool=use.pool)


class RecentJob(BaseModel):
    """One of the tenant's latest jobs."""

    id: str = Field(description="the job")
    kind: str = Field(description="its kind")
    status: Status = Field(description="its status now")
    created_at: str = Field(description=f"when it was submitted ({TIMESTAMP})")
    wait_s: float | None = Field(description="seconds it waited before it started; null "
                                 "until it starts")

    @classmethod
    def of(cls, line: JobLine) -> RecentJob:
        return cls(id=line.id, kind=line.kind, status=line.status,
                   created_at=rfc3339(line.created_at) or "", wait_s=line.wait_s)


class OwnFigures(BaseModel):
    """The calling tenant's own figures."""

    use: TenantUseView = Field(description="its cap and quota use in the default pool")
    pools: list[TenantUseView] = Field(default_factory=list, description="its cap and quota "
                                       "use in each pool, default first")
    wait_p50_s: float | None = Field(description="median wait of its jobs that started in the "
                                     "window; null when none did")
    wait_p95_s: float | None = Field(description="95th percentile of the same waits")
    waits_counted: int = Field(description="its jobs that started in the window")
    jobs_by_status: dict[Status, int] = Field(description="its latest `jobs_counted` jobs by "
                                              "status")
    jobs_counted: int = Field(description="how many of its latest jobs `jobs_by_status` counts "
                              "(at most 500)")
    recent_jobs: list[RecentJob] = Field(description="its latest jobs, newest first")

    @classmethod
    def of(cls, view: TenantView) -> OwnFigures:
        return cls(
            use=TenantUseView.of(view.use),
            pools=[TenantUseView.of(use) for use in view.pools], wait_p50_s=view.waits.p50_s,
            wait_p95_s=view.waits.p95_s, waits_counted=view.waits.count,
            jobs_by_status=dict(view.by_status),
            jobs_counted=view.counted, recent_jobs=[RecentJob.of(j) for j in view.recent],
        )


class RunSizes(BaseModel):
    """Runs of one size bucket: more items than the bucket below holds, at most ``le``."""

    le: float | None = Field(description="the most items a run of this bucket held; null: "
                             "more than the largest bound (256)")
    runs: int = Field(description="runs of this size")


class KindRunsView(BaseModel):
    """One kind's runs (a job run alone is a run of 1): how much it packs."""

    kind: str = Field(description="the kind")
    pool: str = Field(description="the pool that ran it")
    runs: int = Field(description="runs started")
    items: int = Field(description="items (jobs) those runs held")
    mean_items_per_run: float | None = Field(description="items / runs; null before its "
                                             "first run")
    sizes: list[RunSizes] = Field(description="runs per size bucket (1, 2, 4, … 256, more), "
                                  "not cumulative")

    @classmethod
    def of(cls, runs: KindRuns) -> KindRunsView:
        return cls(kind=runs.kind, pool=runs.pool, runs=runs.runs, items=runs.items,
                   mean_items_per_run=runs.mean_items,
                   sizes=[RunSizes(le=None if math.isinf(le) else le, runs=n)
                          for le, n in runs.sizes])


class PoolItemsView(BaseModel):
    """Items a pool's workers start."""

    pool: str = Field(description="the pool")
    items_per_s: float = Field(description="items started a second over the last `window_s`")
    items_started: int = Field(description="items started in all (since Redis last lost its "
                               "data)")

    @classmethod
    def of(cls, items: PoolItems) -> PoolItemsView:
        return cls(pool=items.pool, items_per_s=items.items_per_s,
                   items_started=items.items_started)


class PackingView(BaseModel):
    """How much the workers pack: items per run per kind, items a second per pool."""

    window_s: float = Field(description="seconds over which `items_per_s` is taken")
    pools: list[PoolItemsView] = Field(description="every pool, default first")
    kinds: list[KindRunsView] = Field(description="every kind that ran, by pool then name")

    @classmethod
    def of(cls, packing: Packing) -> PackingView:
        return cls(window_s=packing.window_s,
                   pools=[PoolItemsView.of(items) for items in packing.pools],
                   kinds=[KindRunsView.of(runs) for runs in packing.kinds])


class DashboardResponse(BaseModel):
    """What the dashboard shows: the fleet (admin key) or the calling tenant's own view."""

    view: Literal["fleet", "tenant"] = Field(description="`fleet` for the admin key, "
                                             "`tenant` for a tenant's key")
    at: str = Field(description=f"when the figures were read ({TIMESTAMP})")
    window_s: float = Field(description="seconds of the window of waits and refusals")
    tiers: list[TierCardView] = Field(description="the default pool's tiers; fleet: every "
                                      "tier, best first; tenant: its own tier")
    pool: PoolCard | None = Field(description="the default pool, the only one without "
                                  "[pools] (fleet view only)")
    pools: list[PoolView] = Field(default_factory=list, description="fleet: every pool, "
                                  "default first; tenant: empty")
    workers: list[WorkerView] = Field(default_factory=list, description="fleet: the live "
                                      "workers of every pool, by pool then id, each naming "
                                      "its pool; tenant: empty")
    tenants: list[TenantUseView] = Field(description="fleet: in each pool, default first, "
                                         "the tenants using the largest share of their cap "
                                         "there, most first; tenant: empty")
    tenant: OwnFigures | None = Field(description="the calling tenant's own figures (tenant "
                                      "view only)")
    packing: PackingView | None = Field(default=None, description="fleet: items per run per "
                                        "kind and items a second per pool; tenant: null")

    @classmethod
    def of_fleet(cls, view: FleetView) -> DashboardResponse:
        return cls(view="fleet", at=rfc3339(view.at) or "", window_s=view.window_s,
                   tiers=[TierCardView.of(card) for card in view.tiers],
                   pool=PoolCard.of(view.pool, now=view.at),
                   pools=[pool_view(line) for line in view.pools],
                   workers=[WorkerView.of(worker, view.at, pool)
                            for pool, worker in view.workers],
                   tenants=[TenantUseView.of(use) for use in view.tenants], tenant=None,
                   packing=None if view.packing is None else PackingView.of(view.packing))

    @classmethod
    def of_tenant(cls, view: TenantView) -> DashboardResponse:
        tiers = [] if view.tier is None else [TierCardView.of(view.tier)]
        return cls(view="tenant", at=rfc3339(view.at) or "", window_s=view.window_s,
                   tiers=tiers, pool=None, tenants=[], tenant=OwnFigures.of(view))

