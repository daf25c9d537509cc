"""Fleet-wide event counters kept in Redis, so every process adds to one total.

A per-process Prometheus counter would live and die with the dispatcher that increments it
(and a standby that takes over would start again from zero); these live under the key
prefix, next to the index, and ``/metrics`` on any API replica reads the same value.

- ``reclaimed_key``: leases the reaper took back because nobody renewed them (worker
  killed, machine gone, message lost before start); exposed as
  ``tierq_leases_reclaimed_total``.
"""

from __future__ import annotations

import redis

from jobs.index.keys import IndexKeys


def reclaimed_key(prefix: str) -> str:
    return IndexKeys(prefix).leases_reclaimed


def incr_reclaimed(client: redis.Redis, prefix: str, n: int) -> None:
    """Count ``n`` reclaimed leases (the reaper calls this once per batch)."""
    if n > 0:
        client.incrby(reclaimed_key(prefix), n)


def read_reclaimed(client: redis.Redis, prefix: str) -> int:
    value = client.get(reclaimed_key(prefix))
    return int(value) if value is not None else 0
