"""Engines and sessions, configured per backend.

SQLite (the embedded default): WAL journal so readers never block the writer, foreign keys
on, and explicit ``BEGIN`` emitted by SQLAlchemy instead of the sqlite3 module's implicit one,
so that transactions and SAVEPOINTs behave as they do on PostgreSQL. The file's directory is
created when missing.

SQLite transactions come in two kinds, told apart by how the session began:

- ``with sessions.begin() as session:`` is a write transaction: ``BEGIN IMMEDIATE``, the
  write lock taken at once. Waiting for it honours the busy timeout. A plain (deferred)
  ``BEGIN`` that has read cannot wait: its upgrade to the write lock fails with "database is
  locked" at once while another connection writes, because waiting could deadlock and its
  snapshot would be stale anyway. Every read-then-update (a dispatch round's claim, a
  worker's CAS, a cancel) would then lose its round under concurrent submits.
- ``with sessions() as session:`` (autobegin, never committed) is a read: a deferred
  ``BEGIN`` on a WAL snapshot, which never takes the write lock, so status reads, heartbeat
  polls and rebuilds neither wait for writers nor hold them up. Write only inside
  ``sessions.begin()``.

Rejected: ``BEGIN IMMEDIATE`` for every transaction. Simpler, but every read (each API
request authenticates through SQL; long-polls re-read every few hundred ms) would then take
the single write lock, serialising readers with each other and with writers and turning read
load into busy-timeout failures of writes.

The busy timeout (5 s) bounds the wait for the write lock. Write transactions hold it for
milliseconds (no I/O but SQL inside them), so reaching it means the database is stuck, and
the caller should get its error (an API 503, a worker's retry) rather than wait longer.

PostgreSQL: ``psycopg`` (version 3), a 3 s connect timeout, and a pool as large as the
process's concurrency (``pool_size``): the API serves sync routes from anyio's threadpool of
40 threads, so with 40 pooled connections no request waits for a connection nor opens one;
connections past ``pool_size`` would be closed on return and reopened by the next burst.
Idle connections are not opened in advance, so the dispatcher and the workers hold few.

Connections are not pinged before use: a ping is a round trip on every checkout. A
connection that died while pooled (the server restarted) fails its first statement; the
pool then replaces every connection older than the failure, and the caller answers as for
any outage (the API's 503; see ``jobs.admission.submit._settle_commit`` for a dead COMMIT).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 5000
# Connection execution option naming how the SQLite transaction begins (see _sqlite_on_begin).
SQLITE_BEGIN = "tierq_sqlite_begin"
PG_CONNECT_TIMEOUT_S = 3
# anyio's default threadpool (the API's sync routes): one connection per thread.
DEFAULT_POOL_SIZE = 40
# Connections beyond pool_size for a burst from threads outside that pool.
POOL_OVERFLOW = 10


def normalize_url(url: str | URL) -> URL:
    """``postgresql://`` and ``postgres://`` mean psycopg 3 here."""
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def make_engine(url: str | URL, *, pool_size: int = DEFAULT_POOL_SIZE) -> Engine:
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    if backend == "postgresql":
        return sa.create_engine(
            parsed,
            pool_size=pool_size,
            max_overflow=POOL_OVERFLOW,
            connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S},
        )
    return sa.create_engine(parsed)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose ``sessions.begin()`` is a write transaction (``BEGIN IMMEDIATE`` on
    SQLite, see the module docstring); autobegun ones read."""
    session_class = SqliteSession if engine.dialect.name == "sqlite" else Session
    return sessionmaker(bind=engine, class_=session_class, expire_on_commit=False)


class SqliteSession(Session):
    """An explicit ``begin()`` procures the connection at once, marked to ``BEGIN
    IMMEDIATE``; autobegin (reads) still begins deferred, on the first statement."""

    def begin(self, nested: bool = False) -> SessionTransaction:
        transaction = super().begin(nested=nested)
        if not nested:
            self.connection(execution_options={SQLITE_BEGIN: "IMMEDIATE"})
        return transaction


def _sqlite_engine(url: URL) -> Engine:
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url)
    sa.event.listen(engine, "connect", _sqlite_on_connect)
    sa.event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Hand transaction control to SQLAlchemy (see _sqlite_on_begin).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _sqlite_on_begin(connection: sa.Connection) -> None:
    immediate = connection.get_execution_options().get(SQLITE_BEGIN) == "IMMEDIATE"
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
