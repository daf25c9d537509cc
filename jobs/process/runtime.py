"""The connections a tierq process holds, built once from settings and passed explicitly.

``Runtime`` is what the API, the dispatcher and the workers share: the policy, the SQL
engine and session factory, the Redis client and the dispatch index on it, and the clock
(Redis's, see ``jobs.index.clock``; tests inject their own). Nothing here is created at import time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from jobs.core.policy import Policy
from jobs.index.base import DispatchIndex
from jobs.index.clock import ServerClock
from jobs.index.redis_index import RedisIndex
from jobs.process.settings import Settings
from jobs.store.direct import DirectConnection, DirectPool, direct_pool, one_statement
from jobs.store.engine import LeaderBounds, make_engine, make_sessionmaker


@dataclass
class Runtime:
    settings: Settings
    policy: Policy
    engine: Engine
    sessions: sessionmaker[Session]
    redis: redis.Redis
    index: DispatchIndex
    clock: Callable[[], float] = field(default=time.time)
    # The hot path's single statements on PostgreSQL (``jobs.store.direct``); None: SQLite,
    # or a runtime built by hand (tests), which runs them through ``engine``.
    direct: DirectPool | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, dispatcher: bool = False) -> Runtime:
        """``dispatcher``: every SQL connection bounds its lock waits, statements and idle
        transactions by the leader TTL (``jobs.store.engine.LeaderBounds``), so a stalled
        dispatcher holds no row past about a TTL. The API and workers keep the server's
        defaults; in any process, a transaction on the ``leadership`` row bounds itself."""
        policy = settings.build_policy()
        bounds = LeaderBounds.for_ttl(policy.leader_ttl_s)
        engine = make_engine(settings.resolved_database_url(),
                             pool_size=settings.database_pool_size,
                             bounds=bounds if dispatcher else None)
        client = redis_client(settings.resolved_redis_url())
        index = RedisIndex(client, settings.key_prefix)
        return cls(
            settings=settings,
            policy=policy,
            engine=engine,
            sessions=make_sessionmaker(engine, bounds=bounds),
            redis=client,
            index=index,
            clock=ServerClock(index.now),
            direct=None if dispatcher else direct_pool(engine, size=settings.database_pool_size),
        )

    def one_statement(self) -> contextlib.AbstractContextManager[sa.Connection |
                                                                  DirectConnection]:
        """Where one hot-path statement runs as its own transaction (``jobs.store.direct``)."""
        return one_statement(self.engine, self.direct)

    def close(self) -> None:
        self.redis.close()
        if self.direct is not None:
            self.direct.close()
        self.engine.dispose()


def redis_client(url: str) -> redis.Redis:
    """A client that fails fast: a dead Redis must become a 503 in seconds, not a hang."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=2,
        socket_timeout=5,
        health_check_interval=30,
        retry_on_timeout=False,
    )
