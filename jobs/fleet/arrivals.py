"""The tiers' arrival rates as the leader published them (``jobs.fleet.service_rate``), for
the estimates: a queued job is passed by the better-ranked work that arrives while it waits
(``policy.overtakers``).

The leader measures them every ``SERVICE_REFRESH_S``; each process keeps what it read of a
pool's index for ``CACHE_S``, so a submit rarely pays a Redis round trip for them. Unreadable
or absent (no leader yet, Redis down): no arrivals, the estimate of the jobs ahead alone.
"""

from __future__ import annotations

import threading
import time
import weakref

import redis

from jobs.index.base import DispatchIndex

CACHE_S = 1.0

_LOCK = threading.Lock()
# By index (one per pool and process): when read, and what.
_READ: weakref.WeakKeyDictionary[DispatchIndex, tuple[float, dict[str, float]]] = (
    weakref.WeakKeyDictionary())


def read_arrivals(index: DispatchIndex) -> dict[str, float]:
    """The pool's published rates, per tier (jobs/s), at most ``CACHE_S`` old."""
    now = time.monotonic()
    with _LOCK:
        held = _READ.get(index)
    if held is not None and now - held[0] < CACHE_S:
        return held[1]
    try:
        rates = index.arrival_rates()
    except redis.RedisError:
        rates = {}
    with _LOCK:
        _READ[index] = (now, rates)
    return rates
