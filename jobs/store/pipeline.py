"""A statement and its COMMIT in one round trip, through libpq's pipeline mode.

An ending that starts its slot's next job in the same statement (``jobs.store.moves.
end_and_start``) sent BEGIN, the statement and COMMIT, and its slot waited for two round trips
in a row: the statement's, then the COMMIT's. Here the statement goes out with a flush request
and a Sync in one write. PostgreSQL runs it in an implicit transaction, sends its rows at once
(the flush), then commits at the Sync: the caller has the rows after one round trip (the
next job may run while the COMMIT waits for the disk, as before), and ``commit`` reads the
Sync's answer, which follows without a round trip of its own.

The statement is prepared on its connection the first time (``send_prepare``, in the same
write), as psycopg prepares a statement that recurs; its parameters are adapted and its rows
loaded by psycopg's own adapters, so values read and written are the same as through a
cursor. Errors are SQLAlchemy's, as everywhere in ``jobs.store.direct``.
"""

from __future__ import annotations

import contextlib
import hashlib
import select
import weakref
from collections import namedtuple
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import adapt, pq
from psycopg._queries import PostgresQuery
from psycopg.abc import Transformer

from jobs.store.direct import DirectConnection, DirectResult, _sql_error, commit_lock

if TYPE_CHECKING:
    from jobs.store.direct import DirectPool

_FAILED = frozenset({pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.PIPELINE_ABORTED})

# The statements prepared on each connection, by name (a connection closed is forgotten).
_PREPARED: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[bytes]] = \
    weakref.WeakKeyDictionary()

# Prepared statements' names, by text and parameter types (``_name``).
_NAMES: dict[tuple[bytes, tuple[int, ...]], bytes] = {}

# How a row is made, per list of column names, built once.
_ROWS: dict[tuple[str, ...], Any] = {}


class OneTrip(DirectConnection):
    """One statement and its COMMIT, sent together (``one_trip``, ``locked``): ``execute``
    returns the statement's rows as soon as they come, ``commit`` waits for the COMMIT."""

    def __init__(self, pool: DirectPool, raw: psycopg.Connection[Any]) -> None:
        super().__init__(pool, raw)
        self._open = False  # a Sync was sent whose answer is not read yet

    def execute(self, stmt: Any, params: Mapping[str, Any] | None = None) -> DirectResult:
        """Send the statement and its COMMIT (inside a transaction begun already, a COMMIT
        command; else the Sync commits it); return its rows once they come."""
        if self._open or self.sent:
            raise RuntimeError("one statement per trip")
        compiled, bound = self._bound(stmt, params)
        raw = self._raw
        pgconn = raw.pgconn
        try:
            transformer = adapt.Transformer(raw)
            query = PostgresQuery(transformer)
            query.convert(compiled.sql, bound)
            name = _name(query)
            prepared = _PREPARED.get(raw)
            if prepared is None:
                prepared = _PREPARED[raw] = set()
            in_transaction = pgconn.transaction_status == pq.TransactionStatus.INTRANS
            self.sent = self._open = True
            pgconn.enter_pipeline_mode()
            if name not in prepared:
                pgconn.send_prepare(name, query.query, param_types=query.types)
            pgconn.send_query_prepared(name, query.params, param_formats=query.formats)
            pgconn.send_flush_request()
            if in_transaction:
                pgconn.send_query_params(b"COMMIT", None)
            pgconn.pipeline_sync()
            _flush(pgconn)
            if name not in prepared:
                _check(_results(pgconn), raw)
                prepared.add(name)
            (result,) = _check(_results(pgconn), raw)
        except psycopg.Error as exc:
            self._drain()
            raise _sql_error(exc, raw, compiled.sql, bound) from exc
        rows = _rows(transformer, result) if result.status == pq.ExecStatus.TUPLES_OK else []
        return DirectResult(int(result.command_tuples or 0), rows)

    def commit(self) -> None:
        """Wait for the COMMIT sent with the statement: returns once it has landed."""
        if not self._open:
            return
        raw = self._raw
        try:
            _check(_results(raw.pgconn, until_sync=True), raw)
        except psycopg.Error as exc:
            self._drain()
            raise _sql_error(exc, raw, "COMMIT") from exc
        self._open = False
        raw.pgconn.exit_pipeline_mode()

    def _drain(self) -> None:
        """After an error: the rest of the trip read and pipeline mode left, or the
        connection closed (it is not given back)."""
        raw = self._raw
        if self._open and not raw.closed and not raw.broken:
            with contextlib.suppress(psycopg.Error):
                _results(raw.pgconn, until_sync=True)
                self._open = False
                raw.pgconn.exit_pipeline_mode()
        if self._open:
            raw.close()
        self._open = False


def one_trip(
    pool: DirectPool, *, durable: bool = True
) -> contextlib.AbstractContextManager[OneTrip]:
    """One statement (``OneTrip.execute``) and its COMMIT in one round trip; the COMMIT is
    waited for on leaving. The COMMIT is sent with the statement: an error in the caller's
    block after ``execute`` no longer rolls it back."""
    return _trip(pool, durable=durable, begin=None)


def locked(pool: DirectPool, job_id: str) -> contextlib.AbstractContextManager[OneTrip]:
    """A transaction that holds ``job_id``'s commit lock (``jobs.store.direct.commit_lock``)
    until it ends: BEGIN and the lock are one round trip; its one statement then goes out
    with the COMMIT (``OneTrip``), and leaving waits for that COMMIT (a ROLLBACK on an error
    before the statement). A submit takes it before its job can be leased, so a start that
    waits for it (``DirectPool.await_commit``) sees what that submit's COMMIT or ROLLBACK
    left."""
    classid, objid = commit_lock(job_id)
    return _trip(pool, durable=True,
                 begin=f"BEGIN; SELECT pg_advisory_xact_lock({classid}, {objid})")


@contextlib.contextmanager
def _trip(pool: DirectPool, *, durable: bool, begin: str | None) -> Iterator[OneTrip]:
    """``begin`` first (one round trip; None: none, the Sync commits), then the caller's one
    statement and its COMMIT; on leaving, the COMMIT waited for, or whatever an error left
    read, rolled back or closed."""
    with pool.connection(durable=durable) as connection:
        trip = OneTrip(pool, connection._raw)
        try:
            if begin is not None:
                trip._simple(begin)
            yield trip
            trip.commit()
        finally:
            trip._drain()
            trip._end_open()


def _name(query: PostgresQuery) -> bytes:
    """The prepared statement's name: its text and parameter types (apart from psycopg's
    own ``_pg3_`` names on the same connection), hashed once per pair."""
    key = (query.query, tuple(query.types))
    name = _NAMES.get(key)
    if name is None:
        digest = hashlib.blake2b(query.query, digest_size=12)
        digest.update(repr(key[1]).encode())
        name = _NAMES[key] = b"tierq_" + digest.hexdigest().encode()
    return name


def _flush(pgconn: pq.abc.PGconn) -> None:
    while pgconn.flush():
        select.select([], [pgconn.socket], [])


def _results(pgconn: pq.abc.PGconn, *, until_sync: bool = False) -> list[pq.abc.PGresult]:
    """The next command's results (``until_sync``: every result up to the Sync's), waiting
    for them with the GIL released."""
    found: list[pq.abc.PGresult] = []
    while True:
        pgconn.consume_input()
        while pgconn.is_busy():
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            if not until_sync:
                return found
            continue
        if result.status == pq.ExecStatus.PIPELINE_SYNC:
            return found
        found.append(result)


def _check(results: list[pq.abc.PGresult], raw: psycopg.Connection[Any]) -> list[pq.abc.PGresult]:
    for result in results:
        if result.status in _FAILED:
            raise psycopg.errors.error_from_result(result, encoding=raw.info.encoding)
    return results


def _rows(transformer: Transformer, result: pq.abc.PGresult) -> list[Any]:
    """The rows as ``namedtuple_row`` makes them, loaded by psycopg's adapters."""
    names = tuple((result.fname(i) or b"").decode() for i in range(result.nfields))
    make = _ROWS.get(names)
    if make is None:
        make = _ROWS[names] = namedtuple("Row", names, rename=True)._make  # type: ignore[attr-defined]
    transformer.set_pgresult(result)
    return transformer.load_rows(0, result.ntuples, make)
