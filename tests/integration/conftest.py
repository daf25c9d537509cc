"""Shared integration fixtures. A module may define its own fixture of the same name instead.

- ``index``: every DispatchIndex implementation in turn (the in-memory twin, Redis), for the
  contract suites (test_index_contract*.py).
- ``clock`` and ``client``: a hand-moved clock and an API served over real HTTP on
  PostgreSQL + Redis, for the in-process API tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs.index import DispatchIndex, MemoryIndex, RedisIndex
from tests.integration.api_harness import ApiClient, Clock, make_settings, running_api
from tests.services import RedisServer


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(
    pg_url: str, redis_server: RedisServer, key_prefix: str, clock: Clock, redis_client: Any
) -> Iterator[ApiClient]:
    with running_api(make_settings(pg_url, redis_server.url, key_prefix), clock) as api:
        yield api


@pytest.fixture(params=["memory", "redis"])
def index(request: pytest.FixtureRequest) -> DispatchIndex:
    if request.param == "memory":
        return MemoryIndex()
    client: redis.Redis = request.getfixturevalue("redis_client")
    prefix: str = request.getfixturevalue("key_prefix")
    return RedisIndex(client, prefix)
