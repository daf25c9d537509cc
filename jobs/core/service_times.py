"""Service times per kind, and the mean of the work a pool holds.

One mean over every finished run tells an echo of 20 ms behind a 30 s evaluation that it
waits the mean of the two. The leader keeps a mean (and spread) per kind instead, from the
newest runs of each (``policy.weighted_mean``: recent runs weigh most), and from them the mean
service time of the jobs the pool holds now, queued and running, weighted by their count per
kind: that is what the next slots to free will be spent on, so it is the pool's ``μ``
(``capacity / mix_mean``) for every bound, estimate and Retry-After. A kind with fewer than
``service_samples_min`` runs counts at the pool's overall mean until it has them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from jobs.core.policy import WINDOW, weighted_mean
from jobs.core.remaining import Rest, first_end_s, remaining


@dataclass(frozen=True, kw_only=True)
class KindMean:
    mean_s: float  # recency-weighted, as the pool's overall mean
    spread_s: float  # the plain standard deviation of the same runs
    samples: int  # runs behind it (at most WINDOW)


def kind_means(
    runs_newest_first: Sequence[tuple[str, float]], window: int = WINDOW
) -> dict[str, KindMean]:
    """Each kind's mean over its ``window`` newest runs among ``(kind, seconds)`` runs."""
    by_kind: dict[str, list[float]] = {}
    for kind, seconds in runs_newest_first:
        times = by_kind.setdefault(kind, [])
        if len(times) < window:
            times.append(max(0.0, seconds))
    return {kind: kind_mean(times) for kind, times in by_kind.items()}


def kind_mean(times_newest_first: Sequence[float]) -> KindMean:
    """One kind's measure from its runs, newest first."""
    count = len(times_newest_first)
    plain = sum(times_newest_first) / count
    spread = math.sqrt(sum((t - plain) ** 2 for t in times_newest_first) / count)
    return KindMean(mean_s=weighted_mean(times_newest_first), spread_s=spread, samples=count)


def usable(means: Mapping[str, KindMean], samples_min: int) -> dict[str, float]:
    """The kinds measured well enough to stand for themselves (``service_samples_min``)."""
    return {kind: m.mean_s for kind, m in means.items() if m.samples >= samples_min}


def mix_mean(counts: Mapping[str, int], means: Mapping[str, float], fallback_s: float) -> float:
    """The mean service time of ``counts`` jobs per kind, each kind at its mean (``fallback_s``
    for a kind not measured); ``fallback_s`` when there are none."""
    held = [(kind, n) for kind, n in counts.items() if n > 0]
    if not held:
        return fallback_s
    if len(held) == 1:  # one kind: its mean, exactly
        return means.get(held[0][0], fallback_s)
    work = sum(n * means.get(kind, fallback_s) for kind, n in held)
    return work / sum(n for _, n in held)


def ending_mean(counts: Mapping[str, int], means: Mapping[str, float], fallback_s: float) -> float:
    """The mean service time at which ``counts`` running jobs per kind free their slots for
    the next start: ``n / Σ n_k / mean_k``. Each running job ends at the rate of its kind, so
    the first of them ends at the sum of their rates: among fifteen one-minute evaluations
    and one 20 ms lookup a slot frees in about 20 ms, not in the minute their plain mean
    says (``mix_mean`` is 56 s there, this 0.3 s: sixteen slots at 0.3 s free one every
    20 ms). One kind: its mean, as ``mix_mean``."""
    held = [(kind, n) for kind, n in counts.items() if n > 0]
    if not held:
        return fallback_s
    if len(held) == 1:
        return means.get(held[0][0], fallback_s)
    rate = sum(n / max(1e-9, means.get(kind, fallback_s)) for kind, n in held)
    return sum(n for _, n in held) / rate


def running_mean_s(
    starts: Iterable[tuple[str, float | None]], kinds: Mapping[str, KindMean],
    samples_min: int, fallback_s: float, now: float,
) -> float:
    """The mean at which jobs started at ``starts`` (``(kind, started_at)``; None: not yet)
    free their slots, as ``ending_mean`` means it: ``n`` times the expected time until the
    first of them ends, each by what it has run (``kind_rest``). With every kind memoryless
    it is ``ending_mean``."""
    rests = [kind_rest(kinds, kind, samples_min, fallback_s,
                       0.0 if started is None else now - started) for kind, started in starts]
    return max(0.001, len(rests) * first_end_s(rests))  # finite, as a mean: at least 1 ms


def kind_rest(kinds: Mapping[str, KindMean], kind: str, samples_min: int, fallback_s: float,
              elapsed_s: float) -> Rest:
    """What a running job of ``kind`` that has run ``elapsed_s`` has left
    (``jobs.core.remaining``): by its kind's mean and spread once measured on
    ``samples_min`` runs, else as a job of ``fallback_s`` of unknown spread."""
    measured = kinds.get(kind)
    if measured is None or measured.samples < samples_min:
        return remaining(fallback_s, None, elapsed_s)
    return remaining(measured.mean_s, measured.spread_s, elapsed_s)
