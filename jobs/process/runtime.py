"""The connections a tierq process holds, built once from settings and passed explicitly.

``Runtime`` is what the API, the dispatcher and the workers share: the policy, the SQL
engine and session factory, the Redis client and the dispatch index on it, and the clock
(Redis's, see ``jobs.index.clock``; tests inject their own). Nothing here is created at import time.

A runtime is one pool's (``jobs.core.pools``): its ``index`` and ``policy`` are that pool's
(its keys, its capacity and mean service time). ``for_pool`` and ``for_kind`` give the same
connections seen from another pool; the connections are shared, never opened twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from jobs.core.policy import Policy
from jobs.core.pools import KindScope, Pools
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
    # The pool this runtime's index and policy are; '': the settings' ``pool``.
    pool: str = ""
    # The runtimes of the other pools, built on first use and shared by them all.
    _pools: dict[str, Runtime] = field(default_factory=dict, repr=False)
    _pools_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not self.pool:
            self.pool = self.settings.pool
        self._pools.setdefault(self.pool, self)

    @property
    def prefix(self) -> str:
        """The key prefix of this runtime's pool: its doorbell, counters, hints."""
        return self.settings.pool_prefix(self.pool)

    @functools.cached_property
    def pools(self) -> Pools:
        return self.settings.pool_set()

    @property
    def scope(self) -> KindScope:
        """The kinds of this runtime's pool, for SQL reads that walk one pool's rows."""
        return self.pools.scope(self.pool)

    def for_pool(self, name: str) -> Runtime:
        """The same connections, seen from pool ``name``: its index, its policy."""
        found = self._pools.get(name)
        if found is not None:
            return found
        with self._pools_lock:
            found = self._pools.get(name)
            if found is None:
                self.pools.spec(name)  # ValueError for a pool not configured
                index = RedisIndex(self.redis, self.settings.pool_prefix(name),
                                   root=self.settings.key_prefix)
                found = dataclasses.replace(
                    self, pool=name, index=index, policy=self.settings.pool_policy(name))
                self._pools[name] = found
            return found

    def for_kind(self, kind: str) -> Runtime:
        """The runtime of the pool that runs ``kind``."""
        if not self.settings.pools:
            return self
        return self.for_pool(self.pools.pool_of(kind))

    def every_pool(self) -> list[Runtime]:
        """One runtime per configured pool, ``default`` first."""
        return [self.for_pool(name) for name in self.pools.names]

    @classmethod
    def from_settings(cls, settings: Settings, *, dispatcher: bool = False) -> Runtime:
        """``dispatcher``: every SQL connection bounds its lock waits, statements and idle
        transactions by the leader TTL (``jobs.store.engine.LeaderBounds``), so a stalled
        dispatcher holds no row past about a TTL. The API and workers keep the server's
        defaults; in any process, a transaction on the ``leadership`` row bounds itself."""
        policy = settings.pool_policy(settings.pool)
        bounds = LeaderBounds.for_ttl(policy.leader_ttl_s)
        engine = make_engine(settings.resolved_database_url(),
                             pool_size=settings.database_pool_size,
                             bounds=bounds if dispatcher else None)
        client = redis_client(settings.resolved_redis_url())
        index = RedisIndex(client, settings.pool_prefix(), root=settings.key_prefix)
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

    def one_statement(
        self, *, durable: bool = True
    ) -> contextlib.AbstractContextManager[sa.Connection | DirectConnection]:
        """Where one hot-path statement runs as its own transaction (``jobs.store.direct``;
        ``durable=False``: a commit that does not wait for the disk, ``DirectPool``)."""
        return one_statement(self.engine, self.direct, durable=durable)

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
