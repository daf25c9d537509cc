"""Wake the dispatcher at once when there is something to do (a submit, a released slot).

A Redis list serves as a doorbell: producers push a token, the dispatcher blocks on it with
a timeout (its maintenance period), then drains the rest. A missed ring costs at most one
timeout, never a job: the dispatcher's state lives in the index, not in the tokens.
"""

from __future__ import annotations

import redis

from jobs.index.keys import IndexKeys

# Tokens beyond this are dropped: one pending ring is as good as a thousand.
_MAX_PENDING = 16


def doorbell_key(prefix: str) -> str:
    return IndexKeys(prefix).doorbell


def ring(client: redis.Redis, prefix: str) -> None:
    key = doorbell_key(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.lpush(key, b"1")
    pipe.ltrim(key, 0, _MAX_PENDING - 1)
    pipe.execute()


def wait(client: redis.Redis, prefix: str, timeout_s: float) -> bool:
    """Block until rung or ``timeout_s`` passes; True when rung. Drains pending rings."""
    key = doorbell_key(prefix)
    rung = client.blpop([key], timeout=max(0.01, timeout_s)) is not None
    if rung:
        client.delete(key)
    return rung
