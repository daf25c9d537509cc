"""A tierq handler for the end-to-end bench: it records when it starts, and does nothing else.

The bench measures submit → handler start; only the handler knows when it started, so it
pushes ``time.time()`` onto the Redis list named in its payload, on the Redis at
``BENCH_MARK_REDIS_URL``, where the bench waits for it with BLPOP. Same host, same clock.

Loaded by the bench's tierq processes through ``TIERQ_HANDLERS=start_mark:StartMark`` with
``bench/`` on their ``PYTHONPATH`` (the API needs it too: it validates payloads by kind).
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


class StartMark:
    kind = "mark"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"key": str(payload["key"])}

    def run(self, ctx: Any, payload: dict[str, Any]) -> Any:
        marks().lpush(payload["key"], repr(time.time()))
        return None
