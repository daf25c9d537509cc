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

Packing (a slot's run holds several items of one kind): the worker records each run it
starts, packed or alone, with ``record_run``, one round trip of its own (``record_run.lua``):
the run's size in its kind's histogram of items per run (one hash per kind, stored as the
waits are; the kinds that ran in a set, so a reader knows which hashes to read), and its
items in the pool's count of items started and in the count of the current ``ITEMS_SLOT_S``
slot, so the items started in the last ``ITEMS_WINDOW_S`` are one ``MGET`` of a few keys.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis

from jobs.core.histograms import (
    DISPATCH_BUCKETS_S,
    SEP,
    WAIT_BUCKETS_S,
    WAIT_WINDOW_S,
    Histogram,
    bucket_of,
    cumulative,
)
from jobs.index.keys import IndexKeys

logger = logging.getLogger("tierq.counters")

# How long the leader's count of the live states stands without a new one.
LIVE_TTL_S = 60
# Bucket bounds of the histogram of items per run (``tierq_run_items``).
RUN_ITEMS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Items started are counted per slot of ITEMS_SLOT_S seconds, each kept ITEMS_KEPT_S; the
# recent rate is taken over the last ITEMS_WINDOW_S and the slot under way.
ITEMS_SLOT_S = 10
ITEMS_WINDOW_S = 60
ITEMS_KEPT_S = ITEMS_WINDOW_S + 3 * ITEMS_SLOT_S


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
    # Each kind's items per run (the kinds that recorded a run), and items started.
    run_items: dict[str, Histogram]
    items_started: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _numbers(raw: Mapping[Any, Any]) -> dict[str, float]:
    return {_text(k): float(_text(v)) for k, v in raw.items()}


def _int(value: Any) -> int:
    return int(_text(value)) if value is not None else 0


def read(client: redis.Redis, prefix: str, tiers: Sequence[str]) -> FleetCounters:
    """One pipelined read of every counter and histogram (O(tiers), no scan); once a kind
    recorded a run, a second one of the kinds' histograms of items per run (O(kinds))."""
    keys = IndexKeys(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.leases_reclaimed)
    pipe.hgetall(keys.job_counts)
    pipe.hgetall(keys.rejections)
    pipe.hgetall(keys.repairs)
    pipe.hgetall(keys.live_jobs)
    runs = RunKeys(prefix)
    pipe.smembers(runs.kinds)
    pipe.get(runs.items_started)
    for tier in tiers:
        pipe.hgetall(keys.wait_histogram(tier))
        pipe.hgetall(keys.dispatch_histogram(tier))
    reclaimed, jobs, rejections, repairs, live, kinds, started, *hists = pipe.execute()
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
        run_items=_run_histograms(client, runs, kinds),
        items_started=_int(started),
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


# -- runs: how many items each run a worker started held ------------------------------------


@dataclass(frozen=True)
class RunKeys:
    """The keys of the runs' figures, under a pool's prefix (``IndexKeys.prefix``):
    ``hist:run_items:<kind>`` (hash bucket -> runs of that size, ``sum`` -> their items),
    ``run_kinds`` (set of the kinds that recorded a run), ``counters:items_started`` and
    ``items_started:<slot>`` (items started in slot ``floor(t / ITEMS_SLOT_S)``, a TTL of
    ``ITEMS_KEPT_S``)."""

    prefix: str

    def histogram(self, kind: str) -> str:
        return f"{self.prefix}hist:run_items:{kind}"

    @property
    def kinds(self) -> str:
        return f"{self.prefix}run_kinds"

    @property
    def items_started(self) -> str:
        return f"{self.prefix}counters:items_started"

    @property
    def slot_stem(self) -> str:
        return f"{self.prefix}items_started:"

    def slot(self, number: int) -> str:
        return f"{self.slot_stem}{number}"


@cache
def _record_run_source() -> str:
    return (resources.files("jobs.index") / "lua" / "record_run.lua").read_text(encoding="utf-8")


def record_run(
    client: redis.Redis, prefix: str, *, kind: str, pool: str, items: int,
    now: float | None = None,
) -> None:
    """Count a run of ``items`` items of ``kind`` that a worker of pool ``pool`` (whose
    prefix ``prefix`` is) starts: in the kind's histogram of items per run and in the pool's
    items started. Called once per run, a job run alone included (a run of 1), so the
    histogram shows how much packing there is. ``now``: the fleet's clock (None: Redis's).
    One round trip; best effort: a Redis error is logged, never raised."""
    if items < 1:
        return
    keys = RunKeys(prefix)
    args: list[str | int] = [kind, bucket_of(items, RUN_ITEMS_BUCKETS), items,
                             "" if now is None else repr(float(now)), ITEMS_SLOT_S, ITEMS_KEPT_S]
    try:
        script = client.register_script(_record_run_source())
        script(keys=[keys.histogram(kind), keys.kinds, keys.items_started, keys.slot_stem],
               args=args)
    except redis.RedisError:  # a metric must never stop the run it counts
        logger.warning("counter.failed", extra={"event": "counter.failed", "kind": kind,
                                                "pool": pool, "items": items})


def _run_histograms(client: redis.Redis, keys: RunKeys, kinds: Any) -> dict[str, Histogram]:
    """Each kind's histogram of items per run: one pipelined read (none without kinds)."""
    names = sorted(_text(kind) for kind in kinds or ())
    if not names:
        return {}
    pipe = client.pipeline(transaction=False)
    for kind in names:
        pipe.hgetall(keys.histogram(kind))
    return {kind: cumulative(_numbers(raw), RUN_ITEMS_BUCKETS)
            for kind, raw in zip(names, pipe.execute(), strict=True)}


@dataclass(frozen=True, kw_only=True)
class RecentItems:
    """Items started over the last ``span_s`` seconds: ``ITEMS_WINDOW_S`` and the part of
    the current slot gone by, so that every item counted fell inside the span."""

    items: int
    span_s: float

    @property
    def per_s(self) -> float:
        return self.items / self.span_s if self.span_s > 0 else 0.0


def recent_slots(now: float) -> tuple[list[int], float]:
    """The slots of the last ``ITEMS_WINDOW_S`` seconds and the one under way at ``now``,
    oldest first, and the seconds from the first's start to ``now``. The slot of a time is
    computed as ``record_run.lua`` computes it."""
    current = math.floor(now / ITEMS_SLOT_S)
    first = current - ITEMS_WINDOW_S // ITEMS_SLOT_S
    return list(range(first, current + 1)), now - first * ITEMS_SLOT_S


@dataclass(frozen=True, kw_only=True)
class Runs:
    """One pool's runs: each kind's histogram of items per run, items started in all and
    lately."""

    run_items: dict[str, Histogram]
    items_started: int
    recent: RecentItems


def read_runs(client: redis.Redis, prefix: str, *, now: float) -> Runs:
    """The runs' figures of one pool (``now``: the fleet's clock): two pipelined reads,
    O(kinds)."""
    keys = RunKeys(prefix)
    slots, span_s = recent_slots(now)
    pipe = client.pipeline(transaction=False)
    pipe.smembers(keys.kinds)
    pipe.get(keys.items_started)
    pipe.mget([keys.slot(number) for number in slots])
    kinds, started, counts = pipe.execute()
    recent = RecentItems(items=sum(_int(n) for n in counts), span_s=span_s)
    return Runs(run_items=_run_histograms(client, keys, kinds), items_started=_int(started),
                recent=recent)
