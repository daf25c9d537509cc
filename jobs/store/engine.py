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

Leader bounds (``LeaderBounds``, PostgreSQL only). A dispatcher that stalls (SIGSTOP, a long
GC pause, a hung network) inside a transaction holding the ``leadership`` row would make its
successor's claim wait on that row lock for as long as the stall lasts, its own leader lock
lapsing meanwhile: no failover at all. Derived from the leader lock's TTL:

- ``lock_timeout`` a third of it: a lock wait returns in time for the waiter to renew its
  lock (every third of the TTL) and try again on its next turn (``jobs.dispatch.loop``);
- ``idle_in_transaction_session_timeout`` the TTL (at least a second): the server ends a
  stalled holder's session, rolling its transaction back and releasing its row locks, about
  when its lock lapses anyway;
- ``statement_timeout`` twice the TTL (at least 5 s): a backstop for a statement that hangs
  other than on a lock, holding the row. The loop renews between statements, so one that runs
  past the TTL has cost its leader the lock already; no bounded batch comes near it.

Every transaction that takes or checks the ``leadership`` row sets them for itself
(``bound_leader_transaction``: ``SET LOCAL``, whatever process built the session); the
dispatcher's engine also sets them on each of its connections (``make_engine(bounds=)``), so
no transaction of the dispatcher (a dispatch claim holding job rows, say) outlives a stall
either, nor waits past a third of the TTL on a lock a stalled worker holds. The API and the
workers get none: their requests and handlers may legitimately run statements or hold
transactions longer, and no failover waits on them. SQLite has no such settings: a writer
waits at most the busy timeout (then "database is locked", an outage the loop rides out), but
a writer stalled while holding the write lock holds it until it resumes or exits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from jobs.core.policy import Policy

SQLITE_BUSY_TIMEOUT_MS = 5000
# Connection execution option naming how the SQLite transaction begins (see _sqlite_on_begin).
SQLITE_BEGIN = "tierq_sqlite_begin"
PG_CONNECT_TIMEOUT_S = 3
# anyio's default threadpool (the API's sync routes): one connection per thread.
DEFAULT_POOL_SIZE = 40
# Connections beyond pool_size for a burst from threads outside that pool.
POOL_OVERFLOW = 10
# The session ``info`` key under which a sessionmaker carries its LeaderBounds.
LEADER_BOUNDS = "tierq_leader_bounds"
# The connection ``info`` key of a connection that carries the bounds from its start.
BOUNDED_CONNECTION = "tierq_bounded"
# PostgreSQL's SQLSTATE for a lock wait cut by ``lock_timeout`` (lock_not_available).
LOCK_NOT_AVAILABLE = "55P03"


@dataclass(frozen=True, kw_only=True)
class LeaderBounds:
    """How long the dispatcher's SQL may wait on a lock, run one statement, or sit idle inside
    a transaction (see the module docstring); PostgreSQL only."""

    lock_timeout_s: float
    statement_timeout_s: float
    idle_in_transaction_s: float

    @classmethod
    def for_ttl(cls, leader_ttl_s: float) -> LeaderBounds:
        return cls(
            lock_timeout_s=leader_ttl_s / 3,
            statement_timeout_s=max(2 * leader_ttl_s, 5.0),
            idle_in_transaction_s=max(leader_ttl_s, 1.0),
        )

    def settings(self) -> dict[str, str]:
        """PostgreSQL's parameters, in milliseconds (0 would mean no bound: at least 1)."""
        return {
            "lock_timeout": _ms(self.lock_timeout_s),
            "statement_timeout": _ms(self.statement_timeout_s),
            "idle_in_transaction_session_timeout": _ms(self.idle_in_transaction_s),
        }


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def normalize_url(url: str | URL) -> URL:
    """``postgresql://`` and ``postgres://`` mean psycopg 3 here."""
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def make_engine(
    url: str | URL, *, pool_size: int = DEFAULT_POOL_SIZE, bounds: LeaderBounds | None = None
) -> Engine:
    """``bounds``: set on every PostgreSQL connection (the dispatcher's; see the module
    docstring); ignored on SQLite."""
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    if backend == "postgresql":
        engine = sa.create_engine(
            parsed,
            pool_size=pool_size,
            max_overflow=POOL_OVERFLOW,
            connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S},
        )
        if bounds is not None:
            sa.event.listen(engine, "connect", partial(_pg_on_connect, bounds))
        return engine
    return sa.create_engine(parsed)


def make_sessionmaker(
    engine: Engine, *, bounds: LeaderBounds | None = None
) -> sessionmaker[Session]:
    """Sessions whose ``sessions.begin()`` is a write transaction (``BEGIN IMMEDIATE`` on
    SQLite, see the module docstring); autobegun ones read. ``bounds``: what a transaction
    on the ``leadership`` row sets for itself (``bound_leader_transaction``)."""
    session_class = SqliteSession if engine.dialect.name == "sqlite" else Session
    info = {} if bounds is None else {LEADER_BOUNDS: bounds}
    return sessionmaker(bind=engine, class_=session_class, expire_on_commit=False, info=info)


def bound_leader_transaction(session: Session) -> None:
    """First in a transaction that takes or checks the ``leadership`` row: on PostgreSQL,
    bound its lock waits, statements and idle time (``SET LOCAL``, one round trip), with the
    session's bounds (those of the default leader TTL when it has none); nothing on a
    connection that carries them already."""
    if session.get_bind().dialect.name != "postgresql":
        return
    if session.connection().info.get(BOUNDED_CONNECTION):
        return  # the dispatcher's connections carry the bounds already (``make_engine``)
    bounds = session.info.get(LEADER_BOUNDS)
    if not isinstance(bounds, LeaderBounds):
        bounds = LeaderBounds.for_ttl(Policy.leader_ttl_s)
    settings = bounds.settings()
    session.execute(
        sa.select(*(sa.func.set_config(name, sa.literal(value), True) for name, value in
                    settings.items()))
    )


def lock_wait_timed_out(exc: BaseException) -> bool:
    """True for a lock wait cut short by ``lock_timeout``: the holder will be done (or ended
    by the server) soon, so the caller tries again next turn; not an outage."""
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) == LOCK_NOT_AVAILABLE


@contextlib.contextmanager
def writing(engine: Engine) -> Iterator[sa.Connection]:
    """A write transaction on a Core connection, as ``sessions.begin()`` is on a session
    (``BEGIN IMMEDIATE`` on SQLite): for the hot path's single statements, which need no ORM
    session to be built, begun and closed around them."""
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            connection.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
        with connection.begin():
            yield connection


class SqliteSession(Session):
    """An explicit ``begin()`` procures the connection at once, marked to ``BEGIN
    IMMEDIATE``; autobegin (reads) still begins deferred, on the first statement."""

    def begin(self, nested: bool = False) -> SessionTransaction:
        transaction = super().begin(nested=nested)
        if not nested:
            self.connection(execution_options={SQLITE_BEGIN: "IMMEDIATE"})
        return transaction


def _pg_on_connect(bounds: LeaderBounds, dbapi_connection: Any, record: Any) -> None:
    # Session-wide (is_local false), committed: a pooled connection's reset (a ROLLBACK)
    # keeps them.
    cursor = dbapi_connection.cursor()
    try:
        for name, value in bounds.settings().items():
            cursor.execute("SELECT set_config(%s, %s, false)", (name, value))
    finally:
        cursor.close()
    dbapi_connection.commit()
    record.info[BOUNDED_CONNECTION] = True


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
