"""Queue figures for ``/v1/queues`` and Prometheus instruments for ``/metrics``.

Fleet-wide values (queue depths, oldest ages, pool figures, jobs by state, recent waits) are
read from Redis and SQL when asked, so every API replica reports the same numbers and none
keeps state a fleet would need to share; so are fleet-wide event counts kept in Redis
(``tierq_leases_reclaimed_total``, see ``jobs.counters``) and the pruner's totals kept in SQL
(``tierq_jobs_pruned_total``, ``tierq_jobs_abandoned_total``, see ``jobs.retention``). The
one per-process instrument is the rejection counter; Prometheus sums it over replicas.

``tierq_queue_wait_seconds`` is a histogram of the waits of jobs that started in the last
``WAIT_WINDOW_S`` seconds, recomputed at each scrape: read it with ``histogram_quantile``
directly, not through ``rate()`` (its buckets are a window, not ever-growing counters).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from jobs.capacity import PoolFigures, live_pool
from jobs.counters import read_reclaimed
from jobs.db import repository
from jobs.policy import Policy
from jobs.runtime import Runtime

logger = logging.getLogger(__name__)

WAIT_WINDOW_S = 300.0
WAIT_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


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
    pool = live_pool(runtime, now=now)
    names = tier_names(runtime.policy)
    depths = runtime.index.tier_depths(names)
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
    """Each tier's queue waits of jobs started in the last ``WAIT_WINDOW_S`` seconds."""
    since = now - WAIT_WINDOW_S
    with runtime.sessions() as session:
        return {
            name: repository.recent_waits(session, tier=name, since=since)
            for name in tier_names(runtime.policy)
        }


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
        for backend, families in (("redis", self._index_families), ("sql", self._sql_families)):
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

    def _index_families(self, now: float) -> Iterable[Metric]:
        view = read_index_view(self._runtime, now=now)
        families = {
            "tierq_queue_depth": GaugeMetricFamily(
                "tierq_queue_depth", "Queued jobs per tier", labels=["tier"]),
            "tierq_queue_bound": GaugeMetricFamily(
                "tierq_queue_bound", "Queue bound per tier (Little's law)", labels=["tier"]),
            "tierq_queue_oldest_age_seconds": GaugeMetricFamily(
                "tierq_queue_oldest_age_seconds",
                "Age of the oldest queued job per tier (0 when empty)", labels=["tier"]),
            "tierq_tenant_cap": GaugeMetricFamily(
                "tierq_tenant_cap", "Concurrency cap of one tenant per tier", labels=["tier"]),
        }
        for tier in view.tiers:
            families["tierq_queue_depth"].add_metric([tier.name], tier.queued)
            families["tierq_queue_bound"].add_metric([tier.name], tier.bound)
            families["tierq_queue_oldest_age_seconds"].add_metric(
                [tier.name], tier.oldest_age_s or 0.0)
            families["tierq_tenant_cap"].add_metric([tier.name], tier.tenant_cap)
        yield from families.values()
        pool = view.pool
        yield GaugeMetricFamily("tierq_pool_capacity", "Worker slots in the pool",
                                value=pool.capacity)
        yield GaugeMetricFamily("tierq_pool_inflight", "Leases held now", value=pool.inflight)
        yield GaugeMetricFamily("tierq_pool_utilisation", "inflight / capacity",
                                value=pool.utilisation)
        yield GaugeMetricFamily("tierq_pool_service_rate", "Jobs per second the pool completes",
                                value=pool.service_rate)
        yield GaugeMetricFamily(
            "tierq_pool_mean_service_seconds",
            "Mean service time behind the service rate (measured, or the configured fallback)",
            value=pool.mean_service_s)
        yield CounterMetricFamily(
            "tierq_leases_reclaimed",
            "Leases the reaper took back unrenewed (worker killed, machine gone, message lost)",
            value=read_reclaimed(self._runtime.redis, self._runtime.settings.key_prefix),
        )

    def _sql_families(self, now: float) -> Iterable[Metric]:
        with self._runtime.sessions() as session:
            counts = repository.count_by_status(session)
        jobs = GaugeMetricFamily("tierq_jobs", "Jobs by state", labels=["status"])
        for status, count in counts.items():
            jobs.add_metric([status.value], count)
        yield jobs
        waits = HistogramMetricFamily(
            "tierq_queue_wait_seconds",
            f"Queue wait of jobs started in the last {WAIT_WINDOW_S:g} s, per tier",
            labels=["tier"],
        )
        for tier, values in recent_waits(self._runtime, now=now).items():
            waits.add_metric([tier], _buckets(values), sum_value=sum(values))
        yield waits
        yield from self._retention_families()

    def _retention_families(self) -> Iterable[Metric]:
        """Counters kept in SQL by the pruner (``jobs.retention``): every configured tier,
        0 until its first prune."""
        with self._runtime.sessions() as session:
            totals = repository.retention_totals(session)
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


def _buckets(values: Sequence[float]) -> list[tuple[str, float]]:
    buckets = [(repr(le), float(sum(1 for v in values if v <= le))) for le in WAIT_BUCKETS_S]
    buckets.append(("+Inf", float(len(values))))
    return buckets


class AppMetrics:
    """One registry per app (never the global default), holding both kinds of figures."""

    def __init__(self, runtime: Runtime) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.rejections = Counter(
            "tierq_rejections",
            "Submissions refused with a 429, by tier, cause (capacity, tenant_limit) and the "
            "limit hit (bound, deadline; quota, rate)",
            ["tier", "cause", "limit"],
            registry=self.registry,
        )
        self.registry.register(FleetCollector(runtime))

    def count_refusal(self, *, tier: str, cause: str, limit: str = "") -> None:
        self.rejections.labels(tier=tier, cause=cause, limit=limit).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
