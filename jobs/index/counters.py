"""Fleet-wide event counters and histograms kept in Redis, so every process adds to one total.

A per-process Prometheus counter would live and die with the process that increments it (and
a standby that takes over would start again from zero); these live under the key prefix, next
to the index (``jobs.index.keys``), and ``/metrics`` on any API replica reads the same values.

Most increments ride on a round trip that happens anyway: the admit scripts count refusals
and accepted submissions, the dispatch script the leases it hands out, the worker's start
renewal records the queue wait and the dispatch latency, its release counts how the job
ended. The dispatcher counts what its upkeep committed (expired, failed, leases reclaimed,
repairs) in one pipelined call per round that did any.

Every increment is best effort: in a script it is a ``redis.pcall`` (an error there fails
nothing else the script does), in Python a failure is logged and never raised into the step
it counts, so a metric can lose a count but never strand a job.

Histograms are stored as one hash per tier: each bucket's own count (not cumulative; the
reader adds them up, so an observation is one ``HINCRBY``) and ``sum``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from jobs.core.histograms import (
    DISPATCH_BUCKETS_S,
    SEP,
    WAIT_BUCKETS_S,
    WAIT_WINDOW_S,
    Histogram,
    cumulative,
)
from jobs.index.keys import IndexKeys

logger = logging.getLogger("tierq.counters")

# How long the leader's count of the live states stands without a new one.
LIVE_TTL_S = 60

@dataclass(frozen=True, kw_only=True)
class FleetCounters:
    """Everything ``/metrics`` reads from the counters, in one round trip."""

    reclaimed: int
    jobs: dict[str, int]
    rejections: dict[tuple[str, str, str], int]
    repairs: dict[str, int]
    live: dict[str, int]
    waits: dict[str, Histogram]
    dispatch: dict[str, Histogram]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _numbers(raw: Mapping[Any, Any]) -> dict[str, float]:
    return {_text(k): float(_text(v)) for k, v in raw.items()}


def read(client: redis.Redis, prefix: str, tiers: Sequence[str]) -> FleetCounters:
    """One pipelined read of every counter and histogram (O(tiers), no scan)."""
    keys = IndexKeys(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.leases_reclaimed)
    pipe.hgetall(keys.job_counts)
    pipe.hgetall(keys.rejections)
    pipe.hgetall(keys.repairs)
    pipe.hgetall(keys.live_jobs)
    for tier in tiers:
        pipe.hgetall(keys.wait_histogram(tier))
        pipe.hgetall(keys.dispatch_histogram(tier))
    reclaimed, jobs, rejections, repairs, live, *hists = pipe.execute()
    refused: dict[tuple[str, str, str], int] = {}
    for field, n in _numbers(rejections).items():
        tier, cause, limit = [*field.split(SEP), "", "", ""][:3]
        refused[(tier, cause, limit)] = int(n)
    return FleetCounters(
        reclaimed=int(reclaimed) if reclaimed is not None else 0,
        jobs={k: int(v) for k, v in _numbers(jobs).items()},
        rejections=refused,
        repairs={k: int(v) for k, v in _numbers(repairs).items()},
        live={k: int(v) for k, v in _numbers(live).items()},
        waits={tier: cumulative(_numbers(hists[2 * i]), WAIT_BUCKETS_S)
               for i, tier in enumerate(tiers)},
        dispatch={tier: cumulative(_numbers(hists[2 * i + 1]), DISPATCH_BUCKETS_S)
                  for i, tier in enumerate(tiers)},
    )


def store_live(client: redis.Redis, prefix: str, counts: Mapping[str, int]) -> None:
    """Replace the snapshot of jobs in each live state (the leader's, ``jobs.dispatch.dispatcher``).
    It lapses after ``LIVE_TTL_S`` unless counted again: with no leader counting, the
    series goes absent rather than showing stale figures."""
    key = IndexKeys(prefix).live_jobs
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    if counts:
        pipe.hset(key, mapping={status: str(n) for status, n in counts.items()})
        pipe.expire(key, LIVE_TTL_S)
    pipe.execute()


def recent_waits(
    client: redis.Redis, prefix: str, tiers: Sequence[str], *, now: float
) -> dict[str, list[float]]:
    """Each tier's waits of the starts in the last ``WAIT_WINDOW_S`` seconds (at most
    ``RECENT_WAITS_KEPT``, the newest): one pipelined read, bounded whatever the load."""
    keys = IndexKeys(prefix)
    pipe = client.pipeline(transaction=False)
    for tier in tiers:
        pipe.zrangebyscore(keys.recent_waits(tier), repr(now - WAIT_WINDOW_S), "+inf")
    replies = pipe.execute()
    return {
        tier: [float(_text(member).split(SEP, 1)[0]) for member in members]
        for tier, members in zip(tiers, replies, strict=True)
    }


# -- increments that have no round trip of their own to ride on ------------------------------


def reclaimed_key(prefix: str) -> str:
    return IndexKeys(prefix).leases_reclaimed


def incr_reclaimed(client: redis.Redis, prefix: str, n: int) -> None:
    """Count ``n`` reclaimed leases (the reaper calls this once per batch)."""
    if n > 0:
        client.incrby(reclaimed_key(prefix), n)


def read_reclaimed(client: redis.Redis, prefix: str) -> int:
    value = client.get(reclaimed_key(prefix))
    return int(value) if value is not None else 0


def count(
    client: redis.Redis,
    prefix: str,
    *,
    jobs: Mapping[str, int] | None = None,
    repairs: Mapping[str, int] | None = None,
    rejections: Mapping[tuple[str, str, str], int] | None = None,
    reclaimed: int = 0,
) -> None:
    """Add these counts in one pipelined round trip (nothing when all are 0). Best effort:
    a Redis error is logged, never raised."""
    keys = IndexKeys(prefix)
    pipe = client.pipeline(transaction=False)
    for key, counts in ((keys.job_counts, jobs or {}), (keys.repairs, repairs or {})):
        for field, n in counts.items():
            if n > 0:
                pipe.hincrby(key, field, n)
    for (tier, cause, limit), n in (rejections or {}).items():
        if n > 0:
            pipe.hincrby(keys.rejections, SEP.join((tier, cause, limit)), n)
    if reclaimed > 0:
        pipe.incrby(keys.leases_reclaimed, reclaimed)
    if not len(pipe):
        return
    try:
        pipe.execute()
    except redis.RedisError:  # a metric must never strand the jobs it counts
        logger.warning("counter.failed", extra={"event": "counter.failed"})
