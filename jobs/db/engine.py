"""Engines and sessions, configured per backend.

SQLite (the embedded default): WAL journal so readers never block the writer, a 5 s busy
timeout so concurrent writers wait instead of failing, foreign keys on, and explicit ``BEGIN``
emitted by SQLAlchemy instead of the sqlite3 module's implicit one, so that transactions and
SAVEPOINTs behave as they do on PostgreSQL. The file's directory is created when missing.

PostgreSQL: ``psycopg`` (version 3), connections checked before use, a 3 s connect timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 5000
PG_CONNECT_TIMEOUT_S = 3


def normalize_url(url: str | URL) -> URL:
    """``postgresql://`` and ``postgres://`` mean psycopg 3 here."""
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def make_engine(url: str | URL) -> Engine:
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    if backend == "postgresql":
        return sa.create_engine(
            parsed,
            pool_pre_ping=True,
            connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S},
        )
    return sa.create_engine(parsed, pool_pre_ping=True)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


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
    connection.exec_driver_sql("BEGIN")
