"""What the dashboard shows, assembled from figures read elsewhere: pure, no I/O.

Two views. The fleet's (the admin key): a card per tier (queued against its bound, the
oldest job's age against the tier's ageing guarantee, recent waits against ``max_wait_s``,
recent refusals by cause and limit), the pool, every pool (``jobs.core.pools``) and its live
workers, and each pool's tenants nearest their concurrency cap there. A tenant's (its own
key): its tier's public card with only its own refusals, its cap and quota use in each pool,
its waits and its recent jobs; nothing about any other tenant.

The tier cards and the pool are the default pool's, the only one without ``[pools]``;
the refusals are every pool's. Packing (the fleet's view): each pool's items started a second
over the last minute, and each kind's items per run (their mean and how many runs of each
size), from the counts the workers keep (``jobs.index.counters.record_run``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jobs.admission import estimates
from jobs.core import policy
from jobs.core.domain import JobSummary, Tenant
from jobs.core.histograms import Histogram
from jobs.core.pools import DEFAULT_POOL, Pools
from jobs.core.states import Status
from jobs.dashboard.refusals import RefusalCount
from jobs.fleet.metrics import IndexView, TierFigures, percentile
from jobs.fleet.pool import PoolFigures
from jobs.index.base import LiveWorker
from jobs.index.counters import Runs

NEAREST_TENANTS = 8
RECENT_JOBS = 12


@dataclass(frozen=True, kw_only=True)
class Waits:
    """Queue waits of jobs that started in the window."""

    p50_s: float | None
    p95_s: float | None
    count: int


@dataclass(frozen=True, kw_only=True)
class TierCard:
    name: str
    queued: int
    bound: int
    oldest_age_s: float | None
    # Seconds after which a job of this tier ties with fresh work of the best tier.
    ageing_guarantee_s: float
    max_wait_s: float
    tenant_cap: int
    waits: Waits
    refusals: list[RefusalCount]


@dataclass(frozen=True, kw_only=True)
class TenantUse:
    """A tenant's jobs in flight against its cap, and queued against its quota, in one pool
    (each pool counts them, and sizes the cap and quota, on its own)."""

    name: str
    tier: str
    inflight: int
    cap: int
    queued: int
    quota: int
    pool: str = DEFAULT_POOL

    @property
    def cap_use(self) -> float:
        return self.inflight / self.cap if self.cap else 0.0

    @property
    def quota_use(self) -> float:
        return self.queued / self.quota if self.quota else 0.0


@dataclass(frozen=True, kw_only=True)
class JobLine:
    id: str
    kind: str
    status: Status
    created_at: float
    wait_s: float | None  # started - enqueued; None until it started


@dataclass(frozen=True, kw_only=True)
class PoolLine:
    """One pool: its kinds, its figures and its live workers."""

    name: str
    kinds: list[str] | None  # None: the default pool, which runs every kind no pool names
    figures: PoolFigures
    # The device each runs on and the slots it brings.
    workers: list[LiveWorker] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class KindRuns:
    """One kind's runs, counted since Redis last lost its data: how many, their items, and
    how many runs fell in each size bucket (``sizes``: (upper bound, runs), not cumulative,
    the last bound infinite)."""

    kind: str
    pool: str
    runs: int
    items: int
    sizes: list[tuple[float, int]]

    @property
    def mean_items(self) -> float | None:
        """Items per run on average; None before its first run."""
        return self.items / self.runs if self.runs else None


@dataclass(frozen=True, kw_only=True)
class PoolItems:
    """Items a pool's workers start: a second over the recent window, and in all."""

    pool: str
    items_per_s: float
    items_started: int


@dataclass(frozen=True, kw_only=True)
class Packing:
    window_s: float  # of ``items_per_s``
    pools: list[PoolItems]  # every pool, default first
    kinds: list[KindRuns]  # every kind that ran, by pool then name


@dataclass(frozen=True, kw_only=True)
class FleetView:
    at: float
    window_s: float
    tiers: list[TierCard]
    pool: PoolLine  # the default pool
    # Per pool, default first: its tenants nearest their cap there.
    tenants: list[TenantUse]
    # Every pool, default first.
    pools: list[PoolLine]
    packing: Packing | None = None

    @property
    def workers(self) -> list[tuple[str, LiveWorker]]:
        """Every pool's live workers, each with its pool's name."""
        return [(line.name, worker) for line in self.pools for worker in line.workers]


@dataclass(frozen=True, kw_only=True)
class TenantView:
    at: float
    window_s: float
    tier: TierCard | None  # None only when its tier left the configuration
    use: TenantUse  # in the default pool
    # Its use of every pool, default first.
    pools: list[TenantUse]
    waits: Waits
    # Its latest ``counted`` jobs by status (every status, 0 included).
    by_status: dict[Status, int]
    counted: int
    recent: list[JobLine]


def waits_of(values: Sequence[float]) -> Waits:
    return Waits(p50_s=percentile(values, 0.50), p95_s=percentile(values, 0.95),
                 count=len(values))


def tier_card(
    pol: policy.Policy, tier: TierFigures, waits: Sequence[float],
    refusals: list[RefusalCount],
) -> TierCard:
    config = pol.tiers[tier.name]
    return TierCard(
        name=tier.name, queued=tier.queued, bound=tier.bound, oldest_age_s=tier.oldest_age_s,
        ageing_guarantee_s=policy.ageing_guarantee_s(config, pol.tiers, pol.ageing_rate_s),
        max_wait_s=config.max_wait_s, tenant_cap=tier.tenant_cap, waits=waits_of(waits),
        refusals=refusals,
    )


def tenant_use(
    tenant: Tenant, figures: PoolFigures, *, inflight: int, queued: int,
    pool: str = DEFAULT_POOL,
) -> TenantUse:
    """Its use of its own cap and quota in ``pool`` (its overrides, else its tier's)."""
    quota = tenant.max_queued if tenant.max_queued is not None else figures.quotas.get(
        tenant.tier, 1)
    return TenantUse(name=tenant.name, tier=tenant.tier, inflight=inflight,
                     cap=estimates.tenant_cap(tenant, figures), queued=queued, quota=quota,
                     pool=pool)


def pool_kinds(pools: Pools, name: str) -> list[str] | None:
    """The kinds pool ``name`` runs; None for the default pool, whose kinds are whatever no
    other pool names (not a list a deployment wrote down)."""
    return None if name == DEFAULT_POOL else sorted(pools.spec(name).kinds)


def nearest_cap(
    tenants: Mapping[str, Tenant], inflight: Mapping[str, int], figures: PoolFigures,
    *, limit: int = NEAREST_TENANTS,
) -> list[str]:
    """Ids of the ``limit`` tenants (among ``tenants``) using the largest share of their cap,
    then the most slots, then by name."""
    def share(tenant_id: str) -> tuple[float, int, str]:
        tenant = tenants[tenant_id]
        cap = estimates.tenant_cap(tenant, figures)
        held = inflight.get(tenant_id, 0)
        return (-(held / cap if cap else 0.0), -held, tenant.name)

    return sorted(tenants, key=share)[:limit]


def kind_runs(kind: str, pool: str, hist: Histogram) -> KindRuns:
    """One kind's stored histogram (cumulative buckets) as runs per size bucket."""
    sizes, below = [], 0.0
    for le, count in hist.buckets:
        sizes.append((float(le), round(count - below)))
        below = count
    return KindRuns(kind=kind, pool=pool, runs=round(hist.count), items=round(hist.sum),
                    sizes=sizes)


def packing(runs: Mapping[str, Runs], *, window_s: float) -> Packing:
    """``runs``: each pool's, by name, default first."""
    return Packing(
        window_s=window_s,
        pools=[PoolItems(pool=pool, items_per_s=found.recent.per_s,
                         items_started=found.items_started) for pool, found in runs.items()],
        kinds=[kind_runs(kind, pool, hist) for pool, found in runs.items()
               for kind, hist in sorted(found.run_items.items())],
    )


def fleet_view(
    pol: policy.Policy, *, at: float, window_s: float, view: IndexView,
    waits: Mapping[str, Sequence[float]], refusals: Mapping[str, list[RefusalCount]],
    tenants: list[TenantUse], pools: Sequence[PoolLine], runs: Packing | None = None,
) -> FleetView:
    """``pol``, ``view`` and ``waits``: the default pool's, which ``pools`` lists first;
    ``refusals``: every pool's."""
    cards = [tier_card(pol, tier, waits.get(tier.name, []), refusals.get(tier.name, []))
             for tier in view.tiers]
    return FleetView(at=at, window_s=window_s, tiers=cards, pool=pools[0], tenants=tenants,
                     pools=list(pools), packing=runs)


def job_lines(jobs: Sequence[JobSummary], *, limit: int = RECENT_JOBS) -> list[JobLine]:
    return [
        JobLine(id=job.id, kind=job.kind, status=job.status, created_at=job.created_at,
                wait_s=None if job.started_at is None else max(0.0, job.started_at
                                                               - job.enqueued_at))
        for job in jobs[:limit]
    ]


def status_counts(jobs: Sequence[JobSummary]) -> dict[Status, int]:
    counts = dict.fromkeys(Status, 0)
    for job in jobs:
        counts[job.status] += 1
    return counts


def started_waits(jobs: Sequence[JobSummary], *, since: float) -> list[float]:
    """Waits of the jobs that started at or after ``since``."""
    return [max(0.0, job.started_at - job.enqueued_at) for job in jobs
            if job.started_at is not None and job.started_at >= since]


def tenant_view(
    *, at: float, window_s: float, tier: TierCard | None, use: TenantUse,
    jobs: Sequence[JobSummary], pools: Sequence[TenantUse] = (),
) -> TenantView:
    """``jobs``: the tenant's latest jobs, newest first; ``use``: its use of the default
    pool, which ``pools`` (its use of each pool; none: that one only) lists first."""
    return TenantView(
        at=at, window_s=window_s, tier=tier, use=use, pools=list(pools) or [use],
        waits=waits_of(started_waits(jobs, since=at - window_s)),
        by_status=status_counts(jobs), counted=len(jobs), recent=job_lines(jobs),
    )
