"""The measured mean service time: what the pool's μ is computed from once there is data.

The dispatcher refreshes it (``ServiceRateTracker.refresh``, at most every ``REFRESH_S``)
from the run times of recently finished jobs in SQL, and publishes it in Redis with its
sample count, so every API replica reads the same figure in one round trip
(``read_measured``). Readers use it only once ``policy.service_samples_min`` runs back it
(``mean_service_s``); before that the configured ``mean_service_s`` stands.

With it the leader publishes the pool's work (``jobs.core.arrivals.Work``): each kind's mean,
the running jobs' mean, and each tier's admissions over the last
``policy.arrivals_window_s``, which estimates count as the better-ranked work that passes a
queued job (``jobs.fleet.arrivals`` reads them).

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

from jobs.core.arrivals import Work, arrivals_from
from jobs.core.cadence import SERVICE_REFRESH_S as REFRESH_S
from jobs.core.cadence import SERVICE_STALE_AFTER_S as STALE_AFTER_S
from jobs.core.policy import WINDOW, MeasuredMean, mean_service_s, weighted_mean
from jobs.core.service_times import KindMean, ending_mean, kind_means, mix_mean, usable
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


def _replace(client: redis.Redis, key: str, fields: dict[str, str]) -> None:
    """Replace the hash ``key`` whole (gone when ``fields`` is empty), expiring unrefreshed."""
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    if fields:
        pipe.hset(key, mapping=dict(fields))  # type: ignore[arg-type]
        pipe.expire(key, STALE_AFTER_S)
    pipe.execute()


def publish_work(client: redis.Redis, prefix: str, work: Work, *, now: float) -> None:
    """Replace the published work (``Work.fields``): the tiers' arrivals, the running mean."""
    _replace(client, IndexKeys(prefix).arrivals, work.fields(now))


def publish_kinds(client: redis.Redis, prefix: str, means: dict[str, KindMean]) -> None:
    """Replace the published per-kind means (``Work.kind_fields``)."""
    _replace(client, IndexKeys(prefix).kind_means, Work.kind_fields(means))


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


# The newest runs read each refresh: each kind's mean is over its newest WINDOW among them.
RUNS_READ = 10 * WINDOW


@dataclass
class ServiceRateTracker:
    """Recomputes the measured mean from SQL at most every ``every_s`` and publishes it, with
    the means per kind and the tiers' arrivals."""

    every_s: float = REFRESH_S
    window: int = WINDOW
    _current: MeasuredMean | None = field(default=None, init=False)
    _refreshed_at: float = field(default=-math.inf, init=False)

    def refresh(self, runtime: Runtime, now: float) -> MeasuredMean | None:
        """The current figure; recomputed and published when ``every_s`` has passed."""
        if now - self._refreshed_at < self.every_s:
            return self._current
        pol = runtime.policy
        window_s = pol.arrivals_window_s
        with runtime.sessions() as session:
            runs = stats_sql.recent_runs(session, limit=RUNS_READ, scope=runtime.scope)
            queued, inflight = stats_sql.live_by_kind(session, runtime.scope)
            arrived = stats_sql.arrival_counts(session, since=now - window_s,
                                               scope=runtime.scope)
        self._refreshed_at = now
        times = [seconds for _, seconds in runs[:self.window]]
        kinds = kind_means(runs, self.window)
        means = usable(kinds, pol.service_samples_min)
        measured, running = None, None
        if times:
            # The pool's mean is that of the work it holds queued, each kind at its own mean
            # (with none queued, or one kind, the mean of the latest runs); the running
            # jobs' is published beside it (``policy.expected_wait_s``).
            overall = weighted_mean(times)
            measured = MeasuredMean(mean_s=round(mix_mean(queued, means, overall), 6),
                                    samples=len(times))
            if inflight and len(times) >= pol.service_samples_min:
                running = round(ending_mean(inflight, means, overall), 6)
        pool_mean = mean_service_s(pol, measured)
        publish_kinds(runtime.redis, runtime.prefix, kinds)
        publish_work(runtime.redis, runtime.prefix,
                     Work(arrivals=arrivals_from(arrived, means, pool_mean, window_s),
                          running_mean_s=running), now=now)
        if measured is None:
            self._current = None
            return None
        publish(runtime.redis, runtime.prefix, measured, now=now)
        if self._current is None or abs(self._current.mean_s - measured.mean_s) > 1e-6:
            logger.info("service_rate.measured", extra={
                "event": "service_rate.measured", "mean_s": round(measured.mean_s, 4),
                "samples": measured.samples})
        self._current = measured
        return measured
