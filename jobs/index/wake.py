"""Wake the dispatcher at once when there is something to do (a submit, a released slot).

A Redis list serves as a doorbell: producers push a token and trim the list to one, the
dispatcher blocks on it with a timeout (its maintenance period). One pending token is as
good as a thousand: rings that arrive while the dispatcher works coalesce into the one it
finds next, so its batches grow with the load and waking costs it one round trip. A missed
ring costs at most one timeout, never a job: the dispatcher's state lives in the index, not
in the tokens. Index scripts that free a slot ring in their own round trip (``ring()`` in
``lua/common.lua``, which spells the same key and trim).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from jobs.index.keys import IndexKeys


def doorbell_key(prefix: str) -> str:
    return IndexKeys(prefix).doorbell


def ring(client: redis.Redis, prefix: str) -> None:
    key = doorbell_key(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.lpush(key, b"1")
    pipe.ltrim(key, 0, 0)
    pipe.execute()


def wait(client: redis.Redis, prefix: str | Sequence[str], timeout_s: float) -> bool:
    """Block until rung or ``timeout_s`` passes; True when rung (the token is taken). Several
    prefixes: any of their doorbells (a dispatcher of several pools)."""
    prefixes = [prefix] if isinstance(prefix, str) else list(prefix)
    keys = [doorbell_key(one) for one in prefixes]
    return client.blpop(keys, timeout=max(0.01, timeout_s)) is not None
