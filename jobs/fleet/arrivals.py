"""The pool's work as the leader published it (``jobs.fleet.service_rate``), for the
estimates: the tiers' arrivals (a queued job is passed by the better-ranked work that arrives
while it waits, ``policy.overtakers``), the mean of the jobs running now, and each kind's
measured mean (a tenant at its cap waits for its own jobs, at their kinds' means).

The leader counts the arrivals and the running jobs every ``ARRIVALS_REFRESH_S`` and the
kinds' means every ``SERVICE_REFRESH_S``; each process keeps what it read of a pool for
``CACHE_S``, so a submit rarely pays a Redis round trip for them. Unreadable or
absent (no leader yet, Redis down): nothing measured, and the estimates fall back to the
pool's mean alone.
"""

from __future__ import annotations

import threading
import time
import weakref

import redis

from jobs.core.arrivals import Work
from jobs.index.base import DispatchIndex

CACHE_S = 1.0

_LOCK = threading.Lock()
# By index (one per pool and process): when read, and what.
_READ: weakref.WeakKeyDictionary[DispatchIndex, tuple[float, Work]] = (
    weakref.WeakKeyDictionary())


def read_work(index: DispatchIndex) -> Work:
    """The pool's published work, at most ``CACHE_S`` old."""
    now = time.monotonic()
    with _LOCK:
        held = _READ.get(index)
    if held is not None and now - held[0] < CACHE_S:
        return held[1]
    try:
        work = index.work()
    except redis.RedisError:
        work = Work()
    with _LOCK:
        _READ[index] = (now, work)
    return work
