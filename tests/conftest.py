"""Shared fixtures: real PostgreSQL and Redis (embedded where none runs), isolated per test.

- ``pg_server`` / ``redis_server``: the servers for this session (see tests/services.py).
- ``pg_empty_url``: a fresh, empty PostgreSQL database, dropped afterwards.
- ``pg_url``: a fresh PostgreSQL database at the latest schema (copied from a template).
- ``sqlite_url``: a migrated SQLite file in the test's tmp dir.
- ``db_url``: parametrized over both engines.
- ``redis_client`` + ``key_prefix``: a client and a key prefix of this test's own; only keys
  under that prefix are deleted afterwards.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.services import (
    PostgresServer,
    RedisServer,
    delete_prefixed,
    find_postgres,
    find_redis,
)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    server = find_postgres()
    yield server
    if server.embedded is not None:
        server.embedded.cleanup()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = find_redis()
    yield server
    if server.embedded is not None:
        server.embedded.shutdown()


@pytest.fixture(scope="session")
def pg_template(pg_server: PostgresServer) -> Iterator[str]:
    """A database migrated once per session; each test copies it (much faster than migrating)."""
    from jobs.store.migrate import upgrade

    name = pg_server.create_database()
    upgrade(pg_server.url_for(name))
    yield name
    pg_server.drop_database(name)


@pytest.fixture
def pg_empty_url(pg_server: PostgresServer) -> Iterator[str]:
    name = pg_server.create_database()
    yield pg_server.url_for(name)
    pg_server.drop_database(name)


@pytest.fixture
def pg_url(pg_server: PostgresServer, pg_template: str) -> Iterator[str]:
    name = pg_server.create_database(template=pg_template)
    yield pg_server.url_for(name)
    pg_server.drop_database(name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per session; each test copies it, as ``pg_url`` does."""
    from jobs.store.migrate import upgrade

    path = tmp_path_factory.mktemp("sqlite-template") / "tierq.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "tierq.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def key_prefix() -> str:
    return f"{{tierq-test-{uuid.uuid4().hex[:12]}}}:"


@pytest.fixture
def redis_client(redis_server: RedisServer, key_prefix: str) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    delete_prefixed(client, key_prefix)
    client.close()
