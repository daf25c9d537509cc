"""The hot path's single statements on PostgreSQL, sent straight to the driver.

A submit's INSERT, a worker's start and the compare-and-set that ends an attempt are each one
statement, and a transaction of their own. Through SQLAlchemy each costs three round trips
(``BEGIN``, the statement, ``COMMIT``) and more Python than the database spends on it; here
each is one round trip on an autocommit psycopg connection (PostgreSQL runs a lone statement
as its own transaction), psycopg prepares it server-side once it recurs, and its SQL is the
same Core statement the store builds, compiled once for PostgreSQL. The store's functions
take a ``DirectConnection`` where they take a Core connection, so there is one definition of
each statement; SQLite keeps SQLAlchemy (``jobs.store.engine.writing``), where these costs
are not network round trips.

Errors are SQLAlchemy's (``DBAPIError.instance``, as SQLAlchemy itself raises them), so an
outage, a refused value or a broken connection is told apart as everywhere else. A connection
whose statement failed is closed rather than reused when it is broken. Connections are kept
per process (a fork builds its own) and opened on first use, at most ``size`` kept idle.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import pq
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session

from jobs.store.engine import writing

CONNECT_TIMEOUT_S = 3

# The first key of every commit lock (``commit_lock``): tierq's advisory locks apart from any
# other user's of the same database ('tq').
COMMIT_LOCK_CLASS = 0x7471


def commit_lock(job_id: str) -> tuple[int, int]:
    """The advisory lock a submit holds from before its job can be leased until its row
    commits (``DirectPool.locked``), as the two int4 keys PostgreSQL takes. Two jobs whose
    ids hash alike only wait for each other's commit, never for more."""
    digest = hashlib.blake2b(job_id.encode(), digest_size=4).digest()
    return COMMIT_LOCK_CLASS, int.from_bytes(digest, "big", signed=True)


def _sql_error(exc: psycopg.Error, raw: psycopg.Connection[Any], sql: str | None,
               params: Any = None) -> sa.exc.StatementError:
    """A driver error as SQLAlchemy raises it, so an outage is told apart as everywhere."""
    broken = raw.broken or raw.closed
    return sa.exc.DBAPIError.instance(sql, params, exc, psycopg.Error,
                                      connection_invalidated=broken)


# Each connection's cursor (``DirectConnection._cursor``); a connection closed is forgotten.
_CURSORS: weakref.WeakKeyDictionary[psycopg.Connection[Any], psycopg.Cursor[Any]] = \
    weakref.WeakKeyDictionary()

# What a statement that succeeded returns (``DirectConnection._simple``).
_DONE = frozenset({pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK})


class DirectResult:
    """What the store reads of a statement's result: ``rowcount``, ``first()``, rows."""

    def __init__(self, rowcount: int, rows: list[Any]) -> None:
        self.rowcount = rowcount
        self._rows = rows

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)


class _Compiled:
    """A Core statement as PostgreSQL SQL, with the parameters that hold JSON."""

    def __init__(self, stmt: Any, engine: Engine, keys: tuple[str, ...] | None) -> None:
        compiled = stmt.compile(dialect=engine.dialect,
                                column_keys=None if keys is None else list(keys))
        self.sql = str(compiled)
        names = compiled.bind_names
        # Values the statement holds itself (``status == 'queued'``, ``starts + 1``).
        self.literals = {name: bind.value for bind, name in names.items()
                         if not bind.required and bind.callable is None}
        self.json = frozenset(
            name for bind, name in names.items()
            if isinstance(bind.type, sa.JSON) or isinstance(
                getattr(bind.type, "impl", None), sa.JSON)
        )


class DirectConnection:
    """One autocommit psycopg connection, executing Core statements as the store's
    functions do on a Core connection: each ``execute`` is its own transaction, but inside
    ``DirectPool.locked``."""

    def __init__(self, pool: DirectPool, raw: psycopg.Connection[Any]) -> None:
        self._pool = pool
        self._raw = raw
        # A statement was handed to the server: cut off now, it may have committed (its
        # answer lost), as a COMMIT may have.
        self.sent = False

    def _bound(
        self, stmt: Any, params: Mapping[str, Any] | None
    ) -> tuple[_Compiled, dict[str, Any]]:
        """The statement's SQL, and its parameters with its literals and JSON adapted."""
        compiled = self._pool.compiled(stmt, tuple(params or ()) if stmt.is_insert else None)
        bound = {**compiled.literals, **(params or {})}
        for name in compiled.json & bound.keys():
            value = bound[name]
            if value is not None:
                bound[name] = Jsonb(value)
        return compiled, bound

    def execute(self, stmt: Any, params: Mapping[str, Any] | None = None) -> DirectResult:
        compiled, params = self._bound(stmt, params)
        try:
            self.sent = True
            cursor = self._cursor()
            cursor.execute(compiled.sql, params)
            # Whether it returned rows, read off the result's status: ``description`` would
            # build a column list each time.
            result = cursor.pgresult
            returned = result is not None and result.status == pq.ExecStatus.TUPLES_OK
            rows = cursor.fetchall() if returned else []
        except psycopg.Error as exc:
            raise _sql_error(exc, self._raw, compiled.sql, params) from exc
        return DirectResult(cursor.rowcount, rows)

    def _cursor(self) -> psycopg.Cursor[Any]:
        """The connection's own cursor, kept with it: a new one per statement costs more
        than the statement (its adapters are looked up again each time)."""
        cursor = _CURSORS.get(self._raw)
        if cursor is None or cursor.closed:
            cursor = _CURSORS[self._raw] = self._raw.cursor()
        return cursor

    def _simple(self, sql: str) -> None:
        """A statement of no parameters, several at once (one round trip), sent through
        libpq itself: a ``BEGIN`` or ``COMMIT`` through a cursor costs twice its own time in
        Python. Only the last statement's result comes back; the first error ends them."""
        raw = self._raw
        try:
            result = raw.pgconn.exec_(sql.encode())
            if result.status not in _DONE:
                raise psycopg.errors.error_from_result(result, encoding=raw.info.encoding)
        except psycopg.Error as exc:
            raise _sql_error(exc, raw, sql) from exc

    def _end_open(self) -> None:
        """A transaction an error left open: rolled back, where the connection still works
        (one that does not is closed when given back)."""
        raw = self._raw
        if raw.info.transaction_status != pq.TransactionStatus.IDLE and self.usable:
            with contextlib.suppress(psycopg.Error):
                raw.pgconn.exec_(b"ROLLBACK")

    @property
    def usable(self) -> bool:
        return not (self._raw.broken or self._raw.closed)


class DirectPool:
    """This process's autocommit connections to one PostgreSQL database."""

    def __init__(self, engine: Engine, *, size: int) -> None:
        self._engine = engine
        url: URL = engine.url.set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self._size = size
        self._lock = threading.Lock()
        # Idle connections by durability: a statement on a non-durable one commits without
        # waiting for its WAL to reach the disk (``synchronous_commit = off``).
        self._idle: dict[bool, list[psycopg.Connection[Any]]] = {True: [], False: []}
        self._pid = os.getpid()
        self._compiled: dict[tuple[int, tuple[str, ...] | None], _Compiled] = {}

    def compiled(self, stmt: Any, keys: tuple[str, ...] | None) -> _Compiled:
        key = (id(stmt), keys)
        found = self._compiled.get(key)
        if found is None:  # statements are built once and live as long as the process
            found = self._compiled[key] = _Compiled(stmt, self._engine, keys)
        return found

    @contextlib.contextmanager
    def connection(self, *, durable: bool = True) -> Iterator[DirectConnection]:
        """``durable=False``: the statement's commit returns before its WAL is on disk
        (``synchronous_commit = off``). Only for a change whose loss in a crash of the
        database is repaired like any interruption: it becomes durable with the next durable
        commit of any session, and a crash before that loses it whole, never in part."""
        raw = self._take(durable)
        connection = DirectConnection(self, raw)
        try:
            yield connection
        finally:
            self._give_back(raw, durable)

    def await_commit(self, job_id: str, *, wait_s: float) -> bool:
        """Wait until no transaction holds ``job_id``'s commit lock (``pipeline.locked``): its
        submit has committed or rolled back, if it was committing. One round trip: the lock
        taken shared and let go in a transaction of its own. False when it was not granted
        within ``wait_s`` (the submit hangs)."""
        classid, objid = commit_lock(job_id)
        wait_ms = max(1, round(wait_s * 1000))
        with self.connection(durable=False) as connection:
            try:
                connection._simple(f"BEGIN; SET LOCAL lock_timeout = '{wait_ms}ms'; "
                                   f"SELECT pg_advisory_xact_lock_shared({classid}, {objid}); "
                                   "COMMIT")
            except sa.exc.DBAPIError as exc:
                connection._end_open()
                if is_lock_timeout(exc):
                    return False
                raise
        return True

    @contextlib.contextmanager
    def transaction(
        self, *, durable: bool = True, begin: str = "BEGIN"
    ) -> Iterator[DirectConnection]:
        """Statements in one transaction: ``begin`` (one round trip), the caller's
        statements, COMMIT on leaving (ROLLBACK on an error)."""
        with self.connection(durable=durable) as connection:
            try:
                connection._simple(begin)
                yield connection
                connection.sent = True  # the COMMIT: cut off now, it may have landed
                connection._simple("COMMIT")
            finally:
                connection._end_open()

    def _take(self, durable: bool) -> psycopg.Connection[Any]:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours
                self._idle, self._pid = {True: [], False: []}, os.getpid()
            if self._idle[durable]:
                return self._idle[durable].pop()
        options = "" if durable else "-c synchronous_commit=off"
        try:
            return psycopg.connect(self._conninfo, autocommit=True, row_factory=namedtuple_row,
                                   connect_timeout=CONNECT_TIMEOUT_S, options=options)
        except psycopg.Error as exc:
            raise sa.exc.DBAPIError.instance(
                None, None, exc, psycopg.Error, connection_invalidated=True) from exc

    def _give_back(self, raw: psycopg.Connection[Any], durable: bool) -> None:
        if raw.broken or raw.closed:
            raw.close()
            return
        with self._lock:
            if self._pid == os.getpid() and len(self._idle[durable]) < self._size:
                self._idle[durable].append(raw)
                return
        raw.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {True: [], False: []}
        for raw in (*idle[True], *idle[False]):
            raw.close()


def is_lock_timeout(exc: BaseException) -> bool:
    """The lock of ``DirectPool.locked`` was not granted within its ``wait_s``."""
    return isinstance(getattr(exc, "orig", None), psycopg.errors.LockNotAvailable)


# What the store's single-statement functions run on: a session, a Core connection inside a
# transaction, or a direct connection (each statement its own transaction).
Runner = Session | sa.Connection | DirectConnection


def dialect_of(runner: Runner) -> str:
    """The database a runner's statements go to (a direct connection is PostgreSQL's only)."""
    if isinstance(runner, DirectConnection):
        return "postgresql"
    if isinstance(runner, sa.Connection):
        return runner.dialect.name
    return runner.get_bind().dialect.name


@contextlib.contextmanager
def one_statement(
    engine: Engine, pool: DirectPool | None, *, durable: bool = True
) -> Iterator[sa.Connection | DirectConnection]:
    """Where one hot-path statement runs as a transaction of its own: a direct connection
    on PostgreSQL (``durable``: see ``DirectPool.connection``), else a write transaction on
    a Core connection (``writing``)."""
    if pool is None:
        with writing(engine) as connection:
            yield connection
    else:
        with pool.connection(durable=durable) as direct:
            yield direct


def direct_pool(engine: Engine, *, size: int) -> DirectPool | None:
    """The direct connections of a PostgreSQL engine; None elsewhere (SQLite)."""
    return DirectPool(engine, size=size) if engine.dialect.name == "postgresql" else None
