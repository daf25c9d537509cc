"""The measured mean service time: what the pool's μ is computed from once there is data.

The dispatcher refreshes it (``ServiceRateTracker.refresh``, at most every ``REFRESH_S``)
from the run times of recently finished jobs in SQL, and publishes it in Redis with its
sample count, so every API replica reads the same figure in one round trip
(``read_measured``). Readers use it only once ``policy.service_samples_min`` runs back it
(``mean_service_s``); before that the configured ``mean_service_s`` stands.

With it the leader publishes each tier's arrival rate (``jobs.core.arrivals``): the jobs it
admitted over the last ``policy.arrivals_window_s``, which estimates count as the better-ranked work
that passes a queued job (``jobs.fleet.arrivals`` reads them).

The mean is exponentially weighted by recency over the last ``WINDOW`` runs (the weight halves
every ``HALF_LIFE`` runs), so a change of workload moves μ within tens of jobs while one odd
job moves it little.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import redis

from jobs.core.arrivals import rate_of
from jobs.core.cadence import SERVICE_REFRESH_S as REFRESH_S
from jobs.core.cadence import SERVICE_STALE_AFTER_S as STALE_AFTER_S
from jobs.core.policy import WINDOW, MeasuredMean, weighted_mean
from jobs.index.keys import IndexKeys
from jobs.process.runtime import Runtime
from jobs.store import stats as stats_sql

logger = logging.getLogger(__name__)





def publish(client: redis.Redis, prefix: str, measured: MeasuredMean, *, now: float) -> None:
    key = IndexKeys(prefix).service_mean
    pipe = client.pipeline(transaction=True)
    pipe.hset(key, mapping={"mean_s": repr(measured.mean_s), "samples": measured.samples,
                            "at": repr(now)})
    pipe.expire(key, STALE_AFTER_S)
    pipe.execute()


def publish_arrivals(
    client: redis.Redis, prefix: str, rates: dict[str, float], *, now: float
) -> None:
    """Replace the published arrival rates (a tier without arrivals is absent)."""
    key = IndexKeys(prefix).arrivals
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    pipe.hset(key, mapping={"at": repr(now), **{tier: repr(rate) for tier, rate in rates.items()}})
    pipe.expire(key, STALE_AFTER_S)
    pipe.execute()


def read_measured(client: redis.Redis, prefix: str) -> MeasuredMean | None:
    """The published figure, or None when there is none (one Redis round trip)."""
    raw: list[Any] = client.hmget(IndexKeys(prefix).service_mean, ["mean_s", "samples"])
    mean, samples = raw
    if mean is None or samples is None:
        return None
    value = float(mean)
    if not math.isfinite(value) or value < 0:
        return None
    return MeasuredMean(mean_s=value, samples=int(samples))


@dataclass
class ServiceRateTracker:
    """Recomputes the measured mean from SQL at most every ``every_s`` and publishes it."""

    every_s: float = REFRESH_S
    window: int = WINDOW
    _current: MeasuredMean | None = field(default=None, init=False)
    _refreshed_at: float = field(default=-math.inf, init=False)

    def refresh(self, runtime: Runtime, now: float) -> MeasuredMean | None:
        """The current figure; recomputed and published when ``every_s`` has passed."""
        if now - self._refreshed_at < self.every_s:
            return self._current
        with runtime.sessions() as session:
            times = stats_sql.recent_service_times(session, limit=self.window,
                                                    scope=runtime.scope)
            window = runtime.policy.arrivals_window_s
            arrived = stats_sql.arrival_counts(session, since=now - window, scope=runtime.scope)
        self._refreshed_at = now
        publish_arrivals(runtime.redis, runtime.prefix,
                         {tier: rate_of(count, window) for tier, count in arrived.items()},
                         now=now)
        if not times:
            self._current = None
            return None
        measured = MeasuredMean(mean_s=round(weighted_mean(times), 6), samples=len(times))
        publish(runtime.redis, runtime.prefix, measured, now=now)
        if self._current is None or abs(self._current.mean_s - measured.mean_s) > 1e-6:
            logger.info("service_rate.measured", extra={
                "event": "service_rate.measured", "mean_s": round(measured.mean_s, 4),
                "samples": measured.samples})
        self._current = measured
        return measured
