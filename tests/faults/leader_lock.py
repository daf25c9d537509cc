"""Who holds the leader lock, read from a fault test's own Redis."""

from __future__ import annotations

import redis

from jobs.index.keys import IndexKeys
from tests.faults.servers import ThrowawayRedis


def leader_token(redis_server: ThrowawayRedis, prefix: str) -> str | None:
    """The lock's fencing token (``<epoch>:<host>/<pid>/<random>``); None when nobody holds
    it or Redis cannot be reached."""
    client = redis_server.client()
    try:
        value = client.get(IndexKeys(prefix).leader)
    except redis.RedisError:
        return None
    finally:
        client.close()
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def pid_of(token: str | None) -> int | None:
    """The pid in a fencing token; None for none (or one not of that shape)."""
    if token is None:
        return None
    try:
        return int(token.split(":", 1)[1].split("/")[1])
    except (IndexError, ValueError):
        return None


def leader_pid(redis_server: ThrowawayRedis, prefix: str) -> int | None:
    """The pid of the process holding the lock."""
    return pid_of(leader_token(redis_server, prefix))
