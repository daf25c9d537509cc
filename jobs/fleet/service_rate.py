"""The measured mean service time: what the pool's μ is computed from once there is data.

The dispatcher refreshes it (``ServiceRateTracker.refresh``, at most every ``REFRESH_S``)
from the run times of recently finished jobs in SQL, and publishes it in Redis with its
sample count, so every API replica reads the same figure in one round trip
(``read_measured``). Readers use it only once ``policy.service_samples_min`` runs back it
(``mean_service_s``); before that the configured ``mean_service_s`` stands.

With it the leader publishes the pool's work (``jobs.core.arrivals.Work``): each kind's mean
and spread, and, every ``ARRIVALS_REFRESH_S``, the mean at which the running jobs free their
slots (from what each has run, ``jobs.core.remaining``) and each tier's arrival rate over the
span since it last changed, at most ``policy.arrivals_window_s``, which estimates count as the
better-ranked work that passes a queued job (``jobs.fleet.arrivals`` reads them).

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

from jobs.core.arrivals import Work, arrivals_from, spans
from jobs.core.cadence import ARRIVALS_REFRESH_S
from jobs.core.cadence import SERVICE_REFRESH_S as REFRESH_S
from jobs.core.cadence import SERVICE_STALE_AFTER_S as STALE_AFTER_S
from jobs.core.policy import WINDOW, MeasuredMean, mean_service_s, weighted_mean
from jobs.core.service_times import KindMean, kind_means, mix_mean, running_mean_s, usable
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
    """Recomputes the measured mean from SQL at most every ``every_s`` and publishes it with
    the means per kind; counts the tiers' arrivals and the running jobs' ages at most every
    ``arrivals_every_s`` and publishes the work (``Work``) they make."""

    every_s: float = REFRESH_S
    arrivals_every_s: float = ARRIVALS_REFRESH_S
    window: int = WINDOW
    _current: MeasuredMean | None = field(default=None, init=False)
    _refreshed_at: float = field(default=-math.inf, init=False)
    _counted_at: float = field(default=-math.inf, init=False)
    # The last measure: each kind's, and the latest runs' overall mean (None: no runs).
    _kinds: dict[str, KindMean] = field(default_factory=dict, init=False)
    _overall: float | None = field(default=None, init=False)
    _samples: int = field(default=0, init=False)

    def refresh(self, runtime: Runtime, now: float) -> MeasuredMean | None:
        """The current figure; measured again when ``every_s`` has passed, the work counted
        again when ``arrivals_every_s`` has."""
        if now - self._refreshed_at >= self.every_s:
            self._measure(runtime, now)
        if now - self._counted_at >= self.arrivals_every_s:
            self._count(runtime, now)
        return self._current

    def _measure(self, runtime: Runtime, now: float) -> None:
        pol = runtime.policy
        with runtime.sessions() as session:
            runs = stats_sql.recent_runs(session, limit=RUNS_READ, scope=runtime.scope)
            queued, _ = stats_sql.live_by_kind(session, runtime.scope)
        self._refreshed_at = now
        times = [seconds for _, seconds in runs[:self.window]]
        self._kinds = kind_means(runs, self.window)
        self._samples = len(times)
        means = usable(self._kinds, pol.service_samples_min)
        measured = None
        self._overall = weighted_mean(times) if times else None
        if self._overall is not None:
            # The pool's mean is that of the work it holds queued, each kind at its own mean
            # (with none queued, or one kind, the mean of the latest runs); the running
            # jobs' is published with the arrivals (``policy.expected_wait_s``).
            measured = MeasuredMean(mean_s=round(mix_mean(queued, means, self._overall), 6),
                                    samples=len(times))
        publish_kinds(runtime.redis, runtime.prefix, self._kinds)
        if measured is None:
            self._current = None
            return
        publish(runtime.redis, runtime.prefix, measured, now=now)
        if self._current is None or abs(self._current.mean_s - measured.mean_s) > 1e-6:
            logger.info("service_rate.measured", extra={
                "event": "service_rate.measured", "mean_s": round(measured.mean_s, 4),
                "samples": measured.samples})
        self._current = measured

    def _count(self, runtime: Runtime, now: float) -> None:
        """The tiers' arrivals over the spans since their rates last changed
        (``jobs.core.arrivals``), and the mean at which the running jobs free their slots
        from what each has run (``running_mean_s``)."""
        pol = runtime.policy
        spanned = spans(pol.arrivals_window_s)
        with runtime.sessions() as session:
            arrived = stats_sql.arrival_counts(session, now=now, spans=spanned,
                                               scope=runtime.scope)
            starts = stats_sql.in_flight_starts(session, runtime.scope)
        self._counted_at = now
        means = usable(self._kinds, pol.service_samples_min)
        pool_mean = mean_service_s(pol, self._current)
        running = None
        if starts and self._overall is not None and self._samples >= pol.service_samples_min:
            running = round(running_mean_s(starts, self._kinds, pol.service_samples_min,
                                           self._overall, now), 6)
        publish_work(runtime.redis, runtime.prefix,
                     Work(arrivals=arrivals_from(arrived, means, pool_mean, spanned),
                          running_mean_s=running), now=now)

