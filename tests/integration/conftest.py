"""Fixtures of the in-process API tests: a hand-moved clock and an API served over real HTTP
on PostgreSQL + Redis. A module may define its own ``client`` (other settings) instead."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

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
