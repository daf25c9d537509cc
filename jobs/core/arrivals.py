"""Measured arrival rates: the jobs each tier admitted over the last
``policy.arrivals_window_s``.

A queued job is passed by better-ranked work that arrives while it waits
(``policy.overtakers``); how much arrives is the rate at which each tier is admitted now. The
dispatcher counts admissions in SQL and publishes the rates beside the measured mean service
time (``jobs.fleet.service_rate``); the simulator counts them here, on its virtual clock.
"""

from __future__ import annotations

from collections import deque


def rate_of(count: int, window_s: float) -> float:
    """Jobs/s from ``count`` admissions over the window."""
    return count / window_s


class ArrivalCounter:
    """Admissions per tier within the window, by their times (oldest first)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._times: dict[str, deque[float]] = {}

    def arrived(self, tier: str, now: float) -> None:
        times = self._times.get(tier)
        if times is None:
            times = self._times[tier] = deque()
        times.append(now)

    def rates(self, now: float) -> dict[str, float]:
        """Each tier's rate over the window that ends ``now``."""
        since = now - self.window_s
        found = {}
        for tier, times in self._times.items():
            while times and times[0] < since:
                times.popleft()
            found[tier] = rate_of(len(times), self.window_s)
        return found
