"""Measured arrival rates: the jobs each tier admitted over the last
``policy.arrivals_window_s``.

A queued job is passed by better-ranked work that arrives while it waits
(``policy.overtakers``); how much arrives is the rate at which each tier is admitted now. The
dispatcher counts admissions in SQL and publishes the rates beside the measured mean service
time (``jobs.fleet.service_rate``); the simulator counts them here, on its virtual clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from jobs.core.service_times import KindMean, mix_mean, usable


def rate_of(count: int, window_s: float) -> float:
    """Jobs/s from ``count`` admissions over the window."""
    return count / window_s


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
    counts: Mapping[tuple[str, str], int], means: Mapping[str, float], pool_mean_s: float,
    window_s: float,
) -> dict[str, Arrival]:
    """Each tier's rate over the window from its admissions per ``(tier, kind)``, weighed by
    the mean service time of their kinds (each at its own mean, the pool's ``pool_mean_s``
    for one not measured) over the pool's."""
    by_tier: dict[str, dict[str, int]] = {}
    for (tier, kind), count in counts.items():
        by_tier.setdefault(tier, {})[kind] = count
    found = {}
    for tier, kinds in by_tier.items():
        total = sum(kinds.values())
        if total > 0:
            mean = mix_mean(kinds, means, pool_mean_s)
            found[tier] = Arrival(rate_per_s=rate_of(total, window_s),
                                  weight=mean / pool_mean_s if pool_mean_s > 0 else 1.0)
    return found


class ArrivalCounter:
    """Admissions per tier and kind within the window: their times and kinds (oldest
    first: they arrive in time order), and their counts, kept as they come and go."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._arrived: deque[tuple[float, tuple[str, str]]] = deque()
        self._counts: dict[tuple[str, str], int] = {}

    def arrived(self, tier: str, now: float, kind: str = "") -> None:
        key = (tier, kind)
        self._arrived.append((now, key))
        self._counts[key] = self._counts.get(key, 0) + 1

    def counts(self, now: float) -> dict[tuple[str, str], int]:
        """Each tier's admissions per kind over the window that ends ``now``, as the leader
        counts them in SQL (``jobs.store.stats.arrival_counts``)."""
        since, arrived, counts = now - self.window_s, self._arrived, self._counts
        while arrived and arrived[0][0] < since:
            key = arrived.popleft()[1]
            counts[key] -= 1
            if not counts[key]:
                del counts[key]
        return dict(counts)
