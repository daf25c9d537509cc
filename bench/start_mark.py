"""tierq handlers for the end-to-end bench: one marks when it starts, one holds its slot.

The bench measures submit → handler start; only the handler knows when it started, so
``mark`` pushes ``time.time()`` onto the Redis list named in its payload, on the Redis at
``BENCH_MARK_REDIS_URL``, where the bench waits for it with BLPOP. Same host, same clock.
``hold`` stands for GPU work: it keeps its slot ``seconds`` (sleeping, as a handler waiting
on its device does), then pushes ``"<start> <end>"`` (``time.time()`` both) onto its list, so
that the bench can tell how long each slot stood empty between one job and the next.

Loaded by the bench's tierq processes through
``TIERQ_HANDLERS=start_mark:StartMark,start_mark:Hold`` with ``bench/`` on their
``PYTHONPATH`` (the API needs it too: it validates payloads by kind).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import redis

MARK_URL_ENV = "BENCH_MARK_REDIS_URL"


@functools.cache
def marks() -> redis.Redis:
    """One client per process, made on first use (never at import)."""
    return redis.Redis.from_url(os.environ[MARK_URL_ENV])


def hold_slot(client: redis.Redis, key: str, seconds: float) -> None:
    """Keep the slot ``seconds``, then record when it was held (every system's ``hold``)."""
    started = time.time()
    time.sleep(seconds)
    client.lpush(key, f"{started!r} {time.time()!r}")


class StartMark:
    kind = "mark"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"key": str(payload["key"])}

    def run(self, ctx: Any, payload: dict[str, Any]) -> Any:
        marks().lpush(payload["key"], repr(time.time()))
        return None


class Hold:
    kind = "hold"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"key": str(payload["key"]), "seconds": float(payload["seconds"])}

    def run(self, ctx: Any, payload: dict[str, Any]) -> Any:
        hold_slot(marks(), payload["key"], payload["seconds"])
        return None
