"""Queue figures for ``/v1/queues`` and Prometheus instruments for ``/metrics``.

Every figure is fleet-wide, labelled with its ``pool`` (``jobs.core.pools``), and read from
Redis at scrape time, so every API replica reports
the same numbers and none keeps state a fleet would need to share, and a scrape costs
O(tiers), whatever the size of the jobs table:

- the index's own figures (queue depths, oldest ages, the pool);
- counters kept at the transitions (``jobs.index.counters``): jobs that entered each state,
  refusals, leases reclaimed, the reconciler's repairs;
- ``tierq_queue_wait_seconds`` and ``tierq_dispatch_latency_seconds``: real cumulative
  histograms, one observation per start, so ``histogram_quantile(rate(...))`` works;
- ``tierq_queue_wait_recent_seconds``: the p50/p95 of the waits of the last
  ``WAIT_WINDOW_S`` seconds (what ``/v1/queues`` publishes), as gauges;
- ``tierq_jobs``: jobs in each live state, the leader's snapshot (one bounded SQL count per
  reconciler period for the whole fleet);
- packing: ``tierq_run_items``, a histogram per kind of the items each run a worker started
  held (a job run alone is a run of 1), and ``tierq_pool_items_started_total``, whose
  ``rate()`` is the items a pool starts a second (its recent figure, for the dashboard:
  ``run_figures``).

The one SQL read is the pruner's totals (``tierq_jobs_pruned_total``,
``tierq_jobs_abandoned_total``: one row per tier, see ``jobs.dispatch.retention``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from jobs.core.histograms import WAIT_WINDOW_S as WAIT_WINDOW_S  # the window, re-exported
from jobs.core.histograms import Histogram
from jobs.core.policy import Policy
from jobs.fleet.pool import PoolFigures, live_pool
from jobs.index import counters
from jobs.index.counters import ITEMS_WINDOW_S as ITEMS_WINDOW_S  # the items' window, too
from jobs.process.runtime import Runtime
from jobs.store import stats as stats_sql

logger = logging.getLogger(__name__)

QUANTILES = (0.5, 0.95)
# The states tierq_jobs_entered_total lists (0 until the first), and the repairs.
ENTERED = ("queued", "dispatched", "running", "succeeded", "failed", "cancelled", "expired")
REPAIRS = ("full_pass", "orphan_recovered", "reindexed", "entry_removed")
# Every (cause, limit) a refusal can have: listed at 0 for every tier until the first.
REFUSALS = (("capacity", "bound"), ("capacity", "deadline"), ("tenant_limit", "quota"),
            ("tenant_limit", "rate"), ("tenant_limit", "cap"), ("tenant_limit", "batches"))
# Refusals admit_new.lua counts itself (the ``limit`` of the 429).
COUNTED_BY_ADMIT = frozenset({"bound", "deadline", "quota", "rate", "cap"})


@dataclass(frozen=True, kw_only=True)
class TierFigures:
    name: str
    queued: int
    bound: int
    oldest_age_s: float | None
    tenant_cap: int


@dataclass(frozen=True, kw_only=True)
class IndexView:
    """What Redis says now: the pool and each tier's queue, in priority order."""

    pool: PoolFigures
    tiers: list[TierFigures]


def tier_names(policy: Policy) -> list[str]:
    """Tiers best first (lowest base priority), then by name."""
    return sorted(policy.tiers, key=lambda name: (policy.tiers[name].base_priority, name))


def enqueued_at(policy: Policy, tier: str, order_key: float) -> float:
    """Invert the order key: ``order_key - base_priority * ageing_rate``."""
    return order_key - policy.tiers[tier].base_priority * policy.ageing_rate_s


def read_index_view(runtime: Runtime, *, now: float) -> IndexView:
    names = tier_names(runtime.policy)
    # Read together: a job leased between two reads would be in neither queued nor inflight.
    depths, inflight = runtime.index.depths_and_inflight(names)
    pool = live_pool(runtime, now=now, inflight=inflight)
    tiers = []
    for name in names:
        depth = depths[name]
        oldest = None
        if depth.queued and depth.oldest_order_key is not None:
            oldest = max(0.0, now - enqueued_at(runtime.policy, name, depth.oldest_order_key))
        tiers.append(
            TierFigures(
                name=name, queued=depth.queued, bound=pool.bounds[name], oldest_age_s=oldest,
                tenant_cap=pool.caps[name],
            )
        )
    return IndexView(pool=pool, tiers=tiers)


def recent_waits(runtime: Runtime, *, now: float) -> dict[str, list[float]]:
    """Each tier's queue waits of jobs started in the last ``WAIT_WINDOW_S`` seconds (the
    newest ``RECENT_WAITS_KEPT`` at most), from Redis."""
    return counters.recent_waits(runtime.redis, runtime.prefix,
                                 tier_names(runtime.policy), now=now)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation between ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class FleetCollector:
    """Reads the fleet-wide figures at scrape time. A backend that cannot be reached costs
    its own families only, and shows as ``tierq_backend_up{backend=...} 0``."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterable[Metric]:
        now = self._runtime.clock()
        up = GaugeMetricFamily("tierq_backend_up", "1 when the backend answered this scrape",
                               labels=["backend"])
        for backend, families in (("redis", self._redis_families),
                                  ("sql", self._retention_families)):
            try:
                collected = list(families(now))
            except Exception:
                logger.warning("metrics.backend_failed", exc_info=True,
                               extra={"event": "metrics.backend_failed", "backend": backend})
                up.add_metric([backend], 0)
                continue
            up.add_metric([backend], 1)
            yield from collected
        yield up

    def _redis_families(self, now: float) -> Iterable[Metric]:
        """Every pool's figures, each series labelled with its ``pool``."""
        reads = [_PoolRead.of(pool, now) for pool in self._runtime.every_pool()]
        yield from _queue_families(reads)
        yield from _pool_families(reads)
        yield from _counter_families(reads)
        yield from _run_families(reads)
        yield _histogram("tierq_queue_wait_seconds",
                         "Queue wait (started - enqueued) of each start, per pool and tier",
                         [(read.name, read.found.waits) for read in reads])
        yield _histogram("tierq_dispatch_latency_seconds",
                         "Dispatch to start (broker and worker pick-up) of each start, per "
                         "pool and tier", [(read.name, read.found.dispatch) for read in reads])
        recent = GaugeMetricFamily(
            "tierq_queue_wait_recent_seconds",
            f"Quantiles of the queue waits of the starts in the last {WAIT_WINDOW_S:g} s, per "
            "pool and tier (what /v1/queues publishes; absent when none started)",
            labels=["pool", "tier", "quantile"])
        for read in reads:
            for tier in read.tiers:
                for q in QUANTILES:
                    value = percentile(read.waits[tier], q)
                    if value is not None:
                        recent.add_metric([read.name, tier, repr(q)], value)
        yield recent

    def _retention_families(self, now: float) -> Iterable[Metric]:
        """Counters kept in SQL by the pruner (``jobs.dispatch.retention``): every configured tier,
        0 until its first prune."""
        with self._runtime.sessions() as session:
            totals = stats_sql.retention_totals(session)
        pruned = CounterMetricFamily(
            "tierq_jobs_pruned", "Finished jobs removed after their tier's retention period",
            labels=["tier"])
        abandoned = CounterMetricFamily(
            "tierq_jobs_abandoned",
            "Succeeded jobs pruned before anybody fetched their result (work paid for and "
            "never collected)", labels=["tier"])
        for tier in sorted(set(tier_names(self._runtime.policy)) | set(totals)):
            done, lost = totals.get(tier, (0, 0))
            pruned.add_metric([tier], done)
            abandoned.add_metric([tier], lost)
        yield pruned
        yield abandoned


@dataclass(frozen=True, kw_only=True)
class _PoolRead:
    """One pool's figures as one scrape read them."""

    name: str
    policy: Policy
    tiers: list[str]
    view: IndexView
    found: counters.FleetCounters
    waits: dict[str, list[float]]

    @classmethod
    def of(cls, runtime: Runtime, now: float) -> _PoolRead:
        names = tier_names(runtime.policy)
        return cls(name=runtime.pool, policy=runtime.policy, tiers=names,
                   view=read_index_view(runtime, now=now),
                   found=counters.read(runtime.redis, runtime.prefix, names),
                   waits=recent_waits(runtime, now=now))


def _queue_families(reads: Sequence[_PoolRead]) -> Iterable[Metric]:
    labels = ["pool", "tier"]
    families = {
        "tierq_queue_depth": GaugeMetricFamily(
            "tierq_queue_depth", "Queued jobs per pool and tier", labels=labels),
        "tierq_queue_bound": GaugeMetricFamily(
            "tierq_queue_bound", "Queue bound per pool and tier (Little's law)", labels=labels),
        "tierq_queue_oldest_age_seconds": GaugeMetricFamily(
            "tierq_queue_oldest_age_seconds",
            "Age of the oldest queued job per pool and tier (0 when empty)", labels=labels),
        "tierq_queue_max_wait_seconds": GaugeMetricFamily(
            "tierq_queue_max_wait_seconds",
            "The tier's published wait (max_wait_s): the guarantee the oldest age is held to",
            labels=labels),
        "tierq_tenant_cap": GaugeMetricFamily(
            "tierq_tenant_cap", "Concurrency cap of one tenant per pool and tier",
            labels=labels),
    }
    for read in reads:
        for tier in read.view.tiers:
            at = [read.name, tier.name]
            families["tierq_queue_depth"].add_metric(at, tier.queued)
            families["tierq_queue_bound"].add_metric(at, tier.bound)
            families["tierq_queue_oldest_age_seconds"].add_metric(at, tier.oldest_age_s or 0.0)
            families["tierq_queue_max_wait_seconds"].add_metric(
                at, read.policy.tiers[tier.name].max_wait_s)
            families["tierq_tenant_cap"].add_metric(at, tier.tenant_cap)
    yield from families.values()


def _pool_families(reads: Sequence[_PoolRead]) -> Iterable[Metric]:
    described = (
        ("tierq_pool_capacity", "Worker slots in the pool", "capacity"),
        ("tierq_pool_inflight", "Leases held now", "inflight"),
        ("tierq_pool_utilisation", "inflight / capacity", "utilisation"),
        ("tierq_pool_service_rate", "Jobs per second the pool completes", "service_rate"),
        ("tierq_pool_mean_service_seconds",
         "Mean service time behind the service rate (measured, or the configured fallback)",
         "mean_service_s"),
    )
    for name, documentation, figure in described:
        family = GaugeMetricFamily(name, documentation, labels=["pool"])
        for read in reads:
            family.add_metric([read.name], float(getattr(read.view.pool, figure)))
        yield family


def _counter_families(reads: Sequence[_PoolRead]) -> Iterable[Metric]:
    reclaimed = CounterMetricFamily(
        "tierq_leases_reclaimed",
        "Leases the reaper took back unrenewed (worker killed, machine gone, message lost)",
        labels=["pool"])
    live = GaugeMetricFamily(
        "tierq_jobs", "Jobs in each live state (waiting, queued, dispatched, running) per "
        "pool, counted by the leading dispatcher every reconciler period (absent without a "
        "recent count)", labels=["pool", "status"])
    entered = CounterMetricFamily(
        "tierq_jobs_entered", "Jobs that entered each state per pool, counted at the "
        "transition (queued: accepted submissions and batch items let in)",
        labels=["pool", "status"])
    rejections = CounterMetricFamily(
        "tierq_rejections",
        "Submissions refused with a 429, by pool, tier, cause (capacity, tenant_limit) and "
        "the limit hit (bound, deadline; quota, rate, cap, batches)",
        labels=["pool", "tier", "cause", "limit"])
    repairs = CounterMetricFamily(
        "tierq_reconciler_repairs", "What the reconciler repaired, by pool and kind "
        "(full_pass, orphan_recovered, reindexed, entry_removed)", labels=["pool", "kind"])
    for read in reads:
        found = read.found
        reclaimed.add_metric([read.name], found.reclaimed)
        for status, n in sorted(found.live.items()):
            live.add_metric([read.name, status], n)
        for status in ENTERED:
            entered.add_metric([read.name, status], found.jobs.get(status, 0))
        refused = ({(tier, *kind): 0 for tier in read.tiers for kind in REFUSALS}
                   | found.rejections)
        for (tier, cause, limit), n in sorted(refused.items()):
            rejections.add_metric([read.name, tier, cause, limit], n)
        for kind in REPAIRS:
            repairs.add_metric([read.name, kind], found.repairs.get(kind, 0))
    yield from (reclaimed, live, entered, rejections, repairs)


def _run_families(reads: Sequence[_PoolRead]) -> Iterable[Metric]:
    """Packing: the runs' sizes per kind (labelled with the pool that ran them too, so a kind
    moved to another pool never gives two series of one name), items started per pool."""
    run_items = HistogramMetricFamily(
        "tierq_run_items", "Items per run a worker started, per kind (a job run alone: 1)",
        labels=["pool", "kind"])
    started = CounterMetricFamily(
        "tierq_pool_items_started",
        "Items (jobs) a pool's workers started, each run counting its items; rate() gives the "
        "items a pool starts a second", labels=["pool"])
    for read in reads:
        for kind, hist in sorted(read.found.run_items.items()):
            run_items.add_metric([read.name, kind], hist.buckets, sum_value=hist.sum)
        started.add_metric([read.name], read.found.items_started)
    yield from (run_items, started)


def run_figures(runtime: Runtime, *, now: float) -> counters.Runs:
    """One pool's runs: each kind's items per run, its items started in all and over the
    last ``ITEMS_WINDOW_S``."""
    return counters.read_runs(runtime.redis, runtime.prefix, now=now)


def _histogram(
    name: str, documentation: str, per_pool: Sequence[tuple[str, dict[str, Histogram]]]
) -> Metric:
    family = HistogramMetricFamily(name, documentation, labels=["pool", "tier"])
    for pool, per_tier in per_pool:
        for tier, hist in per_tier.items():
            family.add_metric([pool, tier], hist.buckets, sum_value=hist.sum)
    return family


class AppMetrics:
    """One registry per app (never the global default), holding both kinds of figures."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FleetCollector(runtime))

    def count_refusal(self, *, tier: str, cause: str, limit: str = "") -> None:
        """A 429 answered: the admit script already counted those it refused; any other
        (a tenant's open batches: a batch is not a pool's yet) is counted here under the
        default pool, best effort."""
        if limit not in COUNTED_BY_ADMIT:
            counters.count(self._runtime.redis, self._runtime.prefix,
                           rejections={(tier, cause, limit): 1})

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
