"""Shared integration fixtures. A module may define its own fixture of the same name instead.

- ``index``: every DispatchIndex implementation in turn (the in-memory twin, Redis), for the
  contract suites (test_index_contract*.py).
- ``clock`` and ``client``: a hand-moved clock and an API served over real HTTP on
  PostgreSQL + Redis, for the in-process API tests; ``other``: another process's connections
  to the client's database and Redis (a worker's, a dispatcher's); ``statements``: the SQL
  statements the client's engine runs, counted.
- ``runtime``, ``publisher``, ``tenant``: for the tests of real worker processes, on the
  settings of the module's own ``env`` fixture (``tests.integration.worker_procs``): the
  test's Runtime on the workers' database and index, a Celery publisher, a tenant.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs.core.domain import Tenant
from jobs.index import DispatchIndex, MemoryIndex, RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from tests.integration.api_harness import (
    ADMIN_KEY,
    ApiClient,
    Clock,
    Statements,
    make_settings,
    rt,
    running_api,
)
from tests.integration.worker_procs import new_tenant, runtime_of
from tests.services import RedisServer
from workers.publisher import CeleryPublisher


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(
    pg_url: str, redis_server: RedisServer, key_prefix: str, clock: Clock, redis_client: Any
) -> Iterator[ApiClient]:
    with running_api(make_settings(pg_url, redis_server.url, key_prefix), clock) as api:
        yield api


@pytest.fixture
def pooled(
    pg_url: str, redis_server: RedisServer, key_prefix: str, clock: Clock, redis_client: Any
) -> Iterator[ApiClient]:
    """An API whose ``eval.similarity`` runs in pool ``gpu``, every other kind in default."""
    settings = load_settings(
        database_url=pg_url, redis_url=redis_server.url, key_prefix=key_prefix,
        admin_key=ADMIN_KEY, policy={"pool_concurrency": 4},
        pools={"gpu": {"kinds": ["eval.similarity"], "concurrency": 8}},
    )
    with running_api(settings, clock) as api:
        yield api


@pytest.fixture
def other(client: ApiClient, clock: Clock) -> Iterator[Runtime]:
    """Another process's connections to the same database and Redis."""
    runtime = Runtime.from_settings(rt(client).settings)
    runtime.clock = clock
    yield runtime
    runtime.close()


@pytest.fixture
def statements(client: ApiClient) -> Iterator[Statements]:
    counter = Statements(rt(client).engine)
    yield counter
    counter.close()


@pytest.fixture(params=["memory", "redis"])
def index(request: pytest.FixtureRequest) -> DispatchIndex:
    if request.param == "memory":
        return MemoryIndex()
    client: redis.Redis = request.getfixturevalue("redis_client")
    prefix: str = request.getfixturevalue("key_prefix")
    return RedisIndex(client, prefix)


@pytest.fixture
def runtime(env: dict[str, str], redis_client: redis.Redis) -> Iterator[Runtime]:
    rt = runtime_of(env)
    yield rt
    rt.close()


@pytest.fixture
def publisher(runtime: Runtime) -> Iterator[CeleryPublisher]:
    publisher = CeleryPublisher(runtime.settings)
    yield publisher
    publisher.close()


@pytest.fixture
def tenant(runtime: Runtime) -> Tenant:
    return new_tenant(runtime)
