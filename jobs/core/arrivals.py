"""Measured arrival rates: the jobs each tier admitted over the span since its rate last
changed, at most ``policy.arrivals_window_s``.

A queued job is passed by better-ranked work that arrives while it waits
(``policy.overtakers``); how much arrives is the rate at which each tier is admitted now. A
rate over a fixed window is as many times too low after a step in load as the window is
longer than the time since the step: a minute's window, 5 s after a premium stream starts,
says a twelfth of it, and every lower tier is told a fraction of its wait. So each tier's
admissions are counted over nested spans ending now (``SPANS_S``, about 1.5 times apart, up
to the window), and the rate is taken over the longest span in which they arrived at one
rate (``steady_rate``): a step shows as a cut between a recent span and the rest that the
counts cannot both have come from at one rate. At a steady rate no cut is that unlikely, and
the rate is the window's, as noisy as before; after a step the rate is the recent span's,
within seconds of it (a step to a few jobs a second, within about ``MIN_ARRIVALS`` of them).

The dispatcher counts admissions in SQL and publishes the rates beside the measured mean
service time (``jobs.fleet.service_rate``); the simulator counts them here, on its virtual
clock.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jobs.core.service_times import KindMean, mix_mean, usable

# The spans a tier's admissions are counted over, ending now (each window takes those shorter
# than itself, then itself): 2 s to about 50 min, each about 1.5 times the one before.
SPANS_S = tuple(float(f"{2 * 1.5 ** i:.2g}") for i in range(19))
# How unlikely a cut must be at one rate to count as a change: twice the log-likelihood ratio
# of two rates over one (about 1 in 50,000 for one cut, so that the dozen-odd cuts of every
# refresh leave a steady rate alone).
CHANGE = 18.0
# A recent span with fewer admissions than this may say a rate fell, not that it rose: a
# client's few jobs sent at once are no stream (they wait in the queue, where they count
# already).
MIN_ARRIVALS = 8


def spans(window_s: float) -> tuple[float, ...]:
    """The spans counted for ``window_s``, shortest first, the window last."""
    return (*(s for s in SPANS_S if s < window_s), float(window_s))


def rate_of(count: int, window_s: float) -> float:
    """Jobs/s from ``count`` admissions over the window."""
    return count / window_s


@functools.lru_cache(maxsize=16)
def _log_shares(spans_s: tuple[float, ...]) -> list[list[tuple[float, float]]]:
    """For each span, each shorter one's ``(ln p, ln(1 - p))``, ``p`` its share of it."""
    return [[(math.log(recent / longest), math.log(1.0 - recent / longest))
             for recent in spans_s[:i]] for i, longest in enumerate(spans_s)]


def steady_rate(counts: Sequence[int], spans_s: Sequence[float]) -> tuple[float, int]:
    """The rate over the longest recent span in which ``counts`` (admissions over each of
    ``spans_s``, nested, shortest first) arrived at one rate, and that span's index.

    Starting from the whole window, the cut between a recent span and the rest that is
    least likely at one rate is found; while it is less likely than ``CHANGE`` allows, the
    search goes on within the span inside it (the change may lie within the cut's own
    span, about a third of it). The likelihood ratio of ``n_r`` of ``n`` admissions in
    the recent ``r`` of ``s`` seconds is ``2 (n_r ln(n_r / e) + (n - n_r) ln((n - n_r) /
    (n - e)))``, ``e = n r / s``. A recent span of fewer than ``MIN_ARRIVALS`` gives a
    rate no higher than the shortest span that holds that many."""
    log, shares = math.log, _log_shares(tuple(spans_s))
    last = len(spans_s) - 1
    while last > 0 and counts[last]:
        total = counts[last]
        # Half the ratio, as n_r ln n_r + n_o ln n_o - n ln n - n_r ln p - n_o ln(1 - p) with
        # p = r / s, compared with half the bound.
        worst, cut = CHANGE / 2.0 + total * log(total), -1
        for i, (recent_share, older_share) in enumerate(shares[last]):
            recent = counts[i]
            older = total - recent
            ratio = ((recent * (log(recent) - recent_share) if recent else 0.0)
                     + (older * (log(older) - older_share) if older else 0.0))
            if ratio > worst:
                worst, cut = ratio, i
        if cut < 0:
            break
        # The change lies near the cut, perhaps inside its span: the search goes on from the
        # span within it, wholly after the change.
        last = max(0, cut - 1)
    found = (counts[last] / spans_s[last], last)
    if counts[last] < MIN_ARRIVALS:
        held = next((i for i, n in enumerate(counts) if n >= MIN_ARRIVALS), len(counts) - 1)
        found = min(found, (counts[held] / spans_s[held], held))
    return found


@dataclass(frozen=True, kw_only=True)
class Arrival:
    """A tier's admissions as the leader measured them: jobs/s over the window, and how much
    work each is against the pool's mean when measured (their kinds' mean service time over
    the pool's): a tier of long jobs passes a queued job with more work than its count
    says."""

    rate_per_s: float
    weight: float = 1.0

    @property
    def jobs_per_s(self) -> float:
        """Its rate in jobs of the pool's mean service time, the unit of the pool's ``μ``."""
        return self.rate_per_s * self.weight


@dataclass(frozen=True, kw_only=True)
class Work:
    """What the leader last measured of the work a pool receives and runs: each tier's
    arrivals, and the mean service time of the jobs running now (each at its kind's mean;
    None: none measured)."""

    arrivals: dict[str, Arrival] = field(default_factory=dict)
    running_mean_s: float | None = None
    kinds: dict[str, KindMean] = field(default_factory=dict)  # each kind's measured mean

    def fields(self, now: float) -> dict[str, str]:
        """The published ``arrivals`` hash: ``at``, ``running_s``, ``tier:<name>``."""
        found = {"at": repr(now)}
        if self.running_mean_s is not None:
            found["running_s"] = repr(self.running_mean_s)
        for tier, a in self.arrivals.items():
            found[f"tier:{tier}"] = f"{a.rate_per_s!r} {a.weight!r}"
        return found

    @staticmethod
    def kind_fields(kinds: Mapping[str, KindMean]) -> dict[str, str]:
        """The published ``kind_means`` hash: ``kind -> "mean spread samples"``."""
        return {kind: f"{m.mean_s!r} {m.spread_s!r} {m.samples}" for kind, m in kinds.items()}

    @classmethod
    def parse(cls, published: Mapping[str, str], kinds: Mapping[str, str]) -> Work:
        """The published hashes (anything that does not parse as a finite figure left
        out)."""
        def positive(text: str) -> float | None:
            try:
                value = float(text)
            except ValueError:
                return None
            return value if math.isfinite(value) and value > 0 else None

        arrivals = {}
        for name, text in published.items():
            parts = text.split()
            if not name.startswith("tier:") or len(parts) != 2:
                continue
            rate, weight = positive(parts[0]), positive(parts[1])
            if rate is not None and weight is not None:
                arrivals[name.removeprefix("tier:")] = Arrival(rate_per_s=rate, weight=weight)
        running = published.get("running_s")
        measured = {}
        for kind, text in kinds.items():
            try:
                mean_text, spread, samples = text.split()
                one = KindMean(mean_s=float(mean_text), spread_s=float(spread),
                               samples=int(samples))
            except ValueError:
                continue
            if math.isfinite(one.mean_s) and one.mean_s >= 0 and math.isfinite(one.spread_s):
                measured[kind] = one
        return cls(arrivals=arrivals, running_mean_s=None if running is None
                   else positive(running), kinds=measured)

    def kind_means(self, samples_min: int) -> dict[str, float]:
        """The kinds measured well enough to stand for themselves."""
        return usable(self.kinds, samples_min)

    def later_rates(self) -> dict[str, float]:
        """Each tier's arrivals in jobs/s of the pool's mean (``policy.overtakers``'s
        rates)."""
        return {tier: a.jobs_per_s for tier, a in self.arrivals.items()}


def arrivals_from(
    counts: Mapping[tuple[str, str], Sequence[int]], means: Mapping[str, float],
    pool_mean_s: float, spans_s: Sequence[float],
) -> dict[str, Arrival]:
    """Each tier's rate from its admissions per ``(tier, kind)`` over each of ``spans_s``
    (``steady_rate`` of their sum), weighed by the mean service time of the kinds admitted
    over the span it was taken over (each at its own mean, the pool's ``pool_mean_s`` for one
    not measured) over the pool's. A tier whose rate is 0 now is left out."""
    by_tier: dict[str, dict[str, Sequence[int]]] = {}
    for (tier, kind), spanned in counts.items():
        by_tier.setdefault(tier, {})[kind] = spanned
    found = {}
    for tier, kinds in by_tier.items():
        totals = (next(iter(kinds.values())) if len(kinds) == 1 else
                  [sum(column) for column in zip(*kinds.values(), strict=True)])
        rate, at = steady_rate(totals, spans_s)
        if rate > 0:
            mean = mix_mean({kind: spanned[at] for kind, spanned in kinds.items()}, means,
                            pool_mean_s)
            found[tier] = Arrival(rate_per_s=rate,
                                  weight=mean / pool_mean_s if pool_mean_s > 0 else 1.0)
    return found


class ArrivalCounter:
    """Admissions per tier and kind within the window: their times, oldest first (they
    arrive in time order), counted over each span as ``jobs.store.stats.arrival_counts``
    counts them in SQL."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.spans = spans(window_s)
        # Per (tier, kind): the admission times, and how many at the front left the window.
        self._arrived: dict[tuple[str, str], list[float]] = {}
        self._gone: dict[tuple[str, str], int] = {}

    def arrived(self, tier: str, now: float, kind: str = "") -> None:
        self._arrived.setdefault((tier, kind), []).append(now)

    def counts(self, now: float) -> dict[tuple[str, str], tuple[int, ...]]:
        """Each tier's admissions per kind over each of ``spans`` ending ``now``."""
        found = {}
        for key, times in list(self._arrived.items()):
            gone = bisect_left(times, now - self.window_s, self._gone.get(key, 0))
            if gone == len(times):
                del self._arrived[key]
                self._gone.pop(key, None)
                continue
            if gone > 1024 and 2 * gone > len(times):
                del times[:gone]
                gone = 0
            self._gone[key] = gone
            held = len(times)
            found[key] = tuple(held - bisect_left(times, now - s, gone) for s in self.spans)
        return found
