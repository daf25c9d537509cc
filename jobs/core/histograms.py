"""Histograms as tierq keeps them: bucket bounds, the bucket of a value, cumulative counts.

Pure: the worker picks an observation's bucket here and the start renewal (``renew.lua``)
adds one to it; ``jobs.index.counters`` reads the stored buckets back and ``jobs.fleet.metrics``
exposes them. Also the quantile Prometheus's ``histogram_quantile`` computes, for checking a rate of
these buckets against known observations.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Bucket bounds (seconds) of the queue wait histogram, and of the dispatch latency's.
WAIT_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
DISPATCH_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# The windowed percentiles of /v1/queues: the waits of starts in the last WAIT_WINDOW_S
# seconds, at most RECENT_WAITS_KEPT of them per tier (the newest).
WAIT_WINDOW_S = 300.0
RECENT_WAITS_KEPT = 2048
INF = "+Inf"
SEP = "|"


def bucket_label(le: float) -> str:
    """The ``le`` label of a bucket bound, as Prometheus clients write it (``5.0``)."""
    return INF if math.isinf(le) else repr(float(le))


def bucket_of(value: float, bounds: Sequence[float]) -> str:
    """The label of the first bucket holding ``value`` (``value <= le``)."""
    i = bisect.bisect_left(bounds, value)
    return bucket_label(bounds[i]) if i < len(bounds) else INF


@dataclass(frozen=True, kw_only=True)
class StartFigures:
    """What a worker's start records (with the renewal that announces it): the job's queue
    wait (started - enqueued) and its dispatch latency (started - dispatched, None when the
    row has no dispatch time)."""

    wait_s: float
    dispatch_s: float | None = None

    def script_args(self) -> list[str]:
        """ARGV of renew.lua after its own: wait bucket, wait, latency bucket, latency,
        window, samples kept ('' for the latency: none)."""
        wait = max(0.0, self.wait_s)
        latency = None if self.dispatch_s is None else max(0.0, self.dispatch_s)
        return [
            bucket_of(wait, WAIT_BUCKETS_S), repr(wait),
            "" if latency is None else bucket_of(latency, DISPATCH_BUCKETS_S),
            "" if latency is None else repr(latency),
            repr(WAIT_WINDOW_S), str(RECENT_WAITS_KEPT),
        ]


@dataclass(frozen=True, kw_only=True)
class Histogram:
    """Cumulative buckets ``[(le, count), ..., ("+Inf", count)]`` and the sum."""

    buckets: list[tuple[str, float]]
    sum: float

    @property
    def count(self) -> float:
        return self.buckets[-1][1]


def cumulative(raw: Mapping[str, float], bounds: Sequence[float]) -> Histogram:
    """A stored histogram hash (each bucket's own count, ``sum``) as cumulative buckets."""
    total, buckets = 0.0, []
    for label in [*(bucket_label(le) for le in bounds), INF]:
        total += raw.get(label, 0.0)
        buckets.append((label, total))
    return Histogram(buckets=buckets, sum=raw.get("sum", 0.0))


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus's ``histogram_quantile``: ``buckets`` are cumulative ``(le, count)`` pairs
    in ``le`` order ending with ``+Inf``; linear interpolation inside the bucket that holds
    rank ``q * total``, the first bucket starting at 0, and the highest finite bound when
    the rank falls in ``+Inf``. None when there are no observations."""
    if not buckets or not math.isinf(buckets[-1][0]):
        raise ValueError("the buckets must end with +Inf")
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    for i, (le, count) in enumerate(buckets):
        if count >= rank:
            if math.isinf(le):
                return buckets[-2][0] if len(buckets) > 1 else None
            lower, below = (0.0, 0.0) if i == 0 else buckets[i - 1]
            in_bucket = count - below
            return lower + (le - lower) * ((rank - below) / in_bucket if in_bucket else 0.0)
    return buckets[-2][0]
