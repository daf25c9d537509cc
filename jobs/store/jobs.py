"""The SQL of jobs: insert, read, list, and every state change of a job.

Functions take a ``Session`` first and never commit; the caller owns the transaction
(``with session.begin():``). They return domain values (``jobs.core.domain``), never ORM rows.

- A state change is one conditional ``UPDATE ... WHERE id = :id AND status = :src AND
  attempt = :attempt``; it happened iff exactly one row changed. A move not in
  ``jobs.core.states.TRANSITIONS`` raises ``IllegalTransition`` before any SQL runs.
- A used idempotency key is an ``INSERT ... ON CONFLICT DO NOTHING`` that inserted nothing,
  translated to ``DuplicateJob`` carrying the stored job (read only then, so a fresh key
  costs nothing more); the caller's transaction survives it. A taken tenant name
  is a unique violation caught inside a SAVEPOINT (on PostgreSQL a failed statement would
  otherwise abort the whole transaction), translated to ``InvalidRequest``.
- Reads refresh any row the session already holds (``populate_existing``): conditional
  UPDATEs bypass the identity map, so a cached row could otherwise be stale.
"""

from __future__ import annotations

import base64
import binascii
import functools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from jobs.core.domain import Job, JobSummary, NewJob
from jobs.core.errors import DuplicateJob, IllegalTransition, InvalidRequest, Unavailable
from jobs.core.states import NEW_ATTEMPT, TERMINAL, Status, is_legal
from jobs.store.models import (
    JobRow,
)
from jobs.store.rows import (
    FRESH,
    JOBS,
    dialect,
    dt,
    dt_or_none,
    epoch_or_none,
    job_from_row,
    rowcount,
    summary_from_columns,
)

TRANSITION_FIELDS = frozenset(
    {"result", "result_blob", "error", "not_before", "cancel_requested", "max_attempts", "starts",
     "started_at"}
)


TIME_FIELDS = frozenset({"not_before", "started_at"})


def insert_job(session: Session | sa.Connection, new: NewJob) -> Job:
    """Insert a queued job, attempt 1. A used idempotency key raises ``DuplicateJob``.

    One Core INSERT, no SAVEPOINT: a keyed insert says ``ON CONFLICT DO NOTHING`` on the
    (tenant, key) constraint, so losing a race to a concurrent submit of the same key neither
    aborts the caller's transaction (PostgreSQL) nor needs a unit-of-work flush to detect."""
    values = _new_values(new)
    if new.idempotency_key is None:
        session.execute(_INSERT, values)
    else:
        if not isinstance(session, Session):
            raise TypeError("a keyed insert reads the job holding its key: it needs a session")
        if session.execute(_keyed_insert(dialect(session)), values).first() is None:
            existing = job_by_idempotency_key(session, new.tenant_id, new.idempotency_key)
            if existing is None:  # the winner's row vanished (pruned) in between
                raise Unavailable("the job with this idempotency key moved; retry")
            raise DuplicateJob("this idempotency key was already used by this tenant",
                               job=existing)
    return job_from_row(cast(JobRow, SimpleNamespace(**values)))  # no ORM instance to build


# Built once: a statement's construction costs more than its execution on the hot path.
# The values travel as parameters (``execute(stmt, values)``), so each is compiled once.
_INSERT = sa.insert(JOBS)


@functools.cache
def _keyed_insert(dialect_name: str) -> Any:
    """The dialect's INSERT ... ON CONFLICT DO NOTHING (PostgreSQL and SQLite spell it alike)."""
    insert = pg_insert if dialect_name == "postgresql" else sqlite_insert
    return insert(JOBS).on_conflict_do_nothing(
        index_elements=[JOBS.c.tenant_id, JOBS.c.idempotency_key]
    ).returning(JOBS.c.id)


def _new_values(new: NewJob) -> dict[str, Any]:
    created_at = dt(new.enqueued_at if new.created_at is None else new.created_at)
    return {
        "id": new.id,
        "tenant_id": new.tenant_id,
        "tier": new.tier,
        "kind": new.kind,
        "payload": new.payload,
        "status": Status.QUEUED.value,
        "attempt": 1,
        "max_attempts": new.max_attempts,
        "order_key": new.order_key,
        "created_at": created_at,
        "enqueued_at": dt(new.enqueued_at),
        "max_wait_s": new.max_wait_s,
        "start_by": dt_or_none(new.start_by),
        "not_before": None,
        "dispatched_at": None,
        "started_at": None,
        "finished_at": None,
        "result": None,
        "error": None,
        "idempotency_key": new.idempotency_key,
        "cancel_requested": False,
        "starts": 0,
        "updated_at": created_at,
        "result_fetched_at": None,
        "blob": new.blob,
        "result_blob": None,
    }


def job_by_idempotency_key(session: Session, tenant_id: str, key: str) -> Job | None:
    stmt = sa.select(JobRow).where(JobRow.tenant_id == tenant_id, JobRow.idempotency_key == key)
    row = session.scalars(stmt.limit(1), execution_options=FRESH).first()
    return None if row is None else job_from_row(row)


def get_job(session: Session, job_id: str, *, tenant_id: str | None = None) -> Job | None:
    """The job; with ``tenant_id``, another tenant's job is None (never "forbidden")."""
    stmt = sa.select(JobRow).where(JobRow.id == job_id)
    if tenant_id is not None:
        stmt = stmt.where(JobRow.tenant_id == tenant_id)
    row = session.scalars(stmt.limit(1), execution_options=FRESH).first()
    return None if row is None else job_from_row(row)


def get_jobs(session: Session, job_ids: Iterable[str]) -> dict[str, Job]:
    """The jobs among ``job_ids`` that exist, by id, in one query (a dispatch batch)."""
    ids = list(job_ids)
    if not ids:
        return {}
    stmt = sa.select(JobRow).where(JobRow.id.in_(ids))
    return {row.id: job_from_row(row) for row in session.scalars(stmt, execution_options=FRESH)}


def list_jobs(
    session: Session,
    *,
    tenant_id: str,
    status: Status | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> tuple[list[Job], str | None]:
    """One page of the tenant's jobs, newest first, and the cursor of the next (None: last)."""
    if limit < 1:
        raise InvalidRequest("limit must be at least 1", limit=limit)
    stmt = sa.select(JobRow).where(JobRow.tenant_id == tenant_id)
    if status is not None:
        stmt = stmt.where(JobRow.status == status.value)
    if cursor is not None:
        stmt = stmt.where(JobRow.id < _decode_cursor(cursor))
    stmt = stmt.order_by(JobRow.id.desc()).limit(limit + 1)
    rows = session.scalars(stmt, execution_options=FRESH).all()
    page = [job_from_row(row) for row in rows[:limit]]
    next_cursor = _encode_cursor(page[-1].id) if len(rows) > limit else None
    return page, next_cursor


def latest_jobs(session: Session, *, tenant_id: str, limit: int) -> list[JobSummary]:
    """The tenant's latest ``limit`` jobs, newest first, without payloads or results."""
    stmt = (
        sa.select(JobRow.id, JobRow.kind, JobRow.tier, JobRow.status, JobRow.created_at,
                  JobRow.enqueued_at, JobRow.started_at)
        .where(JobRow.tenant_id == tenant_id)
        .order_by(JobRow.id.desc())
        .limit(limit)
    )
    return [
        summary_from_columns(id=id_, kind=kind, tier=tier, status=status,
                                created_at=created, enqueued_at=enqueued, started_at=started)
        for id_, kind, tier, status, created, enqueued, started in session.execute(stmt)
    ]


def queued_order(session: Session, tenant_id: str) -> list[tuple[float, str]]:
    """The tenant's queued jobs as ``(order_key, id)``, in dispatch order: how many of its own
    jobs are ahead of one of them (its estimate). Sorted here, not by SQL, so ids compare as
    bytes as in the index, whatever the database's collation."""
    stmt = sa.select(JobRow.order_key, JobRow.id).where(
        JobRow.tenant_id == tenant_id, JobRow.status == Status.QUEUED.value
    )
    return sorted((order_key, job_id) for order_key, job_id in session.execute(stmt))


def _encode_cursor(job_id: str) -> str:
    return base64.urlsafe_b64encode(job_id.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> str:
    """The job id the previous page ended on; anything else is an invalid request."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        job_id = str(uuid.UUID(text))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequest("invalid cursor", cursor=cursor) from None
    if job_id != text:
        raise InvalidRequest("invalid cursor", cursor=cursor)
    return job_id


def transition(
    session: Session | sa.Connection,
    job_id: str,
    *,
    src: Status,
    attempt: int,
    dst: Status,
    now: float,
    **fields: Any,
) -> bool:
    """Compare-and-set ``(status, attempt)``: True iff this call made the move.

    Moving to ``running`` counts a start (``starts + 1``); a move back to ``queued`` starts a
    new attempt (``attempt + 1``) and keeps ``started_at``. Every move stamps ``updated_at``.

    ``fields`` may set ``result``, ``error``, ``not_before`` (epoch seconds),
    ``cancel_requested``, ``max_attempts``, and ``starts`` and ``started_at`` (a hand-back
    of a start whose handler never ran puts back the values from before it). False means
    the job was not in ``(src, attempt)``: a late or duplicated message, which must change
    nothing.
    """
    if not is_legal(src, dst):
        raise IllegalTransition(
            f"{src.value} -> {dst.value} is not a legal move", job_id=job_id, src=src, dst=dst
        )
    unknown = set(fields) - TRANSITION_FIELDS
    if unknown:
        raise TypeError(f"transition() got unexpected fields {sorted(unknown)}")
    values = _transition_values(src, attempt, dst, now, fields)
    stmt, names = _transition_stmt(src, dst, tuple(values), values)
    params = {f"v_{name}": values[name] for name in names}
    params.update(w_id=job_id, w_status=src.value, w_attempt=attempt)
    result: Any = session.execute(stmt, params)
    return int(result.rowcount) == 1


_TRANSITION_STMTS: dict[tuple[Status, Status, tuple[str, ...]], tuple[Any, tuple[str, ...]]] = {}


def _transition_stmt(
    src: Status, dst: Status, shape: tuple[str, ...], values: dict[str, Any]
) -> tuple[Any, tuple[str, ...]]:
    """The UPDATE of one shape of move (its source, target and the columns it sets), built
    once: the values that are SQL expressions are part of it, the others bound parameters
    (returned by name)."""
    key = (src, dst, shape)
    found = _TRANSITION_STMTS.get(key)
    if found is None:
        names = tuple(name for name in shape if not isinstance(values[name], sa.ClauseElement))
        sets = {name: values[name] if name not in names
                else sa.bindparam(f"v_{name}", type_=JOBS.c[name].type) for name in shape}
        stmt = (
            sa.update(JOBS)
            .where(JOBS.c.id == sa.bindparam("w_id"),
                   JOBS.c.status == sa.bindparam("w_status"),
                   JOBS.c.attempt == sa.bindparam("w_attempt"))
            .values(sets)
        )
        found = _TRANSITION_STMTS[key] = (stmt, names)
    return found


_STARTS_PLUS_ONE = JOBS.c.starts + 1


def _transition_values(
    src: Status, attempt: int, dst: Status, now: float, fields: dict[str, Any]
) -> dict[str, Any]:
    values: dict[str, Any] = {"status": dst.value, "updated_at": dt(now)}
    if dst is Status.DISPATCHED:
        values["dispatched_at"] = dt(now)
    elif dst is Status.RUNNING:
        values.update(started_at=dt(now), starts=_STARTS_PLUS_ONE)
    elif dst.terminal:
        values["finished_at"] = dt(now)
    if (src, dst) in NEW_ATTEMPT:
        # started_at stays: the client can tell a job that ran from one that never did.
        values.update(attempt=attempt + 1, dispatched_at=None)
    for name, value in fields.items():
        values[name] = dt_or_none(value) if name in TIME_FIELDS else value
    return values


@dataclass(frozen=True, kw_only=True)
class Claimed:
    """A job a dispatch round moved to ``dispatched``: what publishing it needs."""

    id: str
    tenant_id: str
    tier: str
    attempt: int
    order_key: float
    start_by: float | None


def claim(session: Session, job_ids: Sequence[str], *, now: float) -> dict[str, Claimed]:
    """Move the queued jobs among ``job_ids`` whose deadline has not passed to
    ``dispatched``, in one statement: a dispatch round's claim, whatever its size. Each row
    is claimed at the attempt it holds (the caller compares it with its lease). Jobs not
    returned are not queued, past ``start_by``, or absent: the caller reads those."""
    if not job_ids:
        return {}
    at = dt(now)
    stmt = (
        sa.update(JOBS)
        .where(
            JOBS.c.id.in_(list(job_ids)),
            JOBS.c.status == Status.QUEUED.value,
            sa.or_(JOBS.c.start_by.is_(None), JOBS.c.start_by > at),
        )
        .values(status=Status.DISPATCHED.value, dispatched_at=at, updated_at=at)
        .returning(JOBS.c.id, JOBS.c.tenant_id, JOBS.c.tier, JOBS.c.attempt, JOBS.c.order_key,
                   JOBS.c.start_by)
    )
    return {
        row.id: Claimed(id=row.id, tenant_id=row.tenant_id, tier=row.tier, attempt=row.attempt,
                        order_key=row.order_key, start_by=epoch_or_none(row.start_by))
        for row in session.execute(stmt)
    }


def start(
    session: Session | sa.Connection,
    job_id: str,
    *,
    attempt: int,
    now: float,
    token: str | None = None,
    dispatched_at: float | None = None,
) -> Job | None:
    """Compare-and-set ``queued`` (or ``dispatched``, a row of an earlier version) →
    ``running`` for this attempt and return the row, in one statement: a worker's start,
    which is also the claim (a dispatch writes nothing to SQL). Only a job that may start
    starts: not flagged to cancel, its ``start_by`` not passed. None: it did not move
    (stale, cancelled, late, or not committed yet: the caller reads the row to tell which).
    ``token`` names the start as the caller's own (``started_by``); ``dispatched_at``: when
    its lease was taken (kept when the row has one)."""
    at = dt(now)
    row = session.execute(_START, {
        "w_id": job_id, "w_attempt": attempt, "v_at": at, "v_token": token,
        "v_dispatched_at": at if dispatched_at is None else dt(dispatched_at),
    }).first()
    return None if row is None else job_from_row(cast(JobRow, row))


# What a worker's start moves from: a queued row (its lease is the claim), or a dispatched
# one (claimed in SQL by a dispatcher of an earlier version).
_STARTABLE = (Status.QUEUED.value, Status.DISPATCHED.value)
_AT = sa.bindparam("v_at", type_=JOBS.c.started_at.type)
_START = (
    sa.update(JOBS)
    .where(
        JOBS.c.id == sa.bindparam("w_id"),
        sa.or_(*(JOBS.c.status == status for status in _STARTABLE)),
        JOBS.c.attempt == sa.bindparam("w_attempt"),
        JOBS.c.cancel_requested.is_(False),
        sa.or_(JOBS.c.start_by.is_(None), JOBS.c.start_by > _AT),
    )
    .values(status=Status.RUNNING.value, started_at=_AT, starts=JOBS.c.starts + 1,
            updated_at=_AT, start_token=sa.bindparam("v_token"),
            dispatched_at=sa.func.coalesce(JOBS.c.dispatched_at, sa.bindparam(
                "v_dispatched_at", type_=JOBS.c.dispatched_at.type)))
    .returning(*JOBS.c)
)


def started_by(
    session: Session | sa.Connection, job_id: str, *, attempt: int, token: str
) -> Job | None:
    """The row, if this attempt is running under the start made with ``token``: a start
    whose COMMIT answer was lost is found again by its maker, never by a copy of the same
    message (another worker's start of this attempt holds another token)."""
    stmt = sa.select(JOBS).where(
        JOBS.c.id == job_id,
        JOBS.c.status == Status.RUNNING.value,
        JOBS.c.attempt == attempt,
        JOBS.c.start_token == token,
    )
    row = session.execute(stmt).first()
    return None if row is None else job_from_row(cast(JobRow, row))


def unstart_fields(job: Job) -> dict[str, Any]:
    """The ``transition`` fields that take back a start whose handler never ran: ``starts``
    as before it, ``started_at`` cleared when it was the first (else the earlier start's
    time is not known here, and the latest stays)."""
    starts = max(0, job.starts - 1)
    return {"starts": starts} if starts else {"starts": 0, "started_at": None}


def request_cancel(session: Session, job_id: str) -> bool:
    """Flag a job that has not finished for cancellation; False when it has (or is unknown)."""
    stmt = (
        sa.update(JOBS)
        .where(JOBS.c.id == job_id, JOBS.c.status.not_in([s.value for s in TERMINAL]))
        .values(cancel_requested=True)
    )
    return rowcount(session, stmt) == 1


def jobs_in_status(session: Session, statuses: Iterable[Status]) -> list[Job]:
    """Jobs in these states in dispatch order (``order_key``, then id): rebuilds the index."""
    values = [status.value for status in statuses]
    stmt = sa.select(JobRow).where(JobRow.status.in_(values)).order_by(JobRow.order_key, JobRow.id)
    return [job_from_row(row) for row in session.scalars(stmt, execution_options=FRESH)]


def settled_queued(
    session: Session, *, after: tuple[float, str] | None, until: float, limit: int
) -> list[Job]:
    """Queued jobs whose last change is at or before ``until``, in ``(updated_at, id)`` order
    after the cursor ``after`` (None: from the start): one bounded step of a walk."""
    stmt = sa.select(JobRow).where(
        JobRow.status == Status.QUEUED.value, JobRow.updated_at <= dt(until)
    )
    if after is not None:
        at, job_id = dt(after[0]), after[1]
        stmt = stmt.where(
            sa.or_(JobRow.updated_at > at, sa.and_(JobRow.updated_at == at, JobRow.id > job_id))
        )
    stmt = stmt.order_by(JobRow.updated_at, JobRow.id).limit(limit)
    return [job_from_row(row) for row in session.scalars(stmt, execution_options=FRESH)]


def jobs_after(
    session: Session, statuses: Iterable[Status], *, after: str, limit: int
) -> list[Job]:
    """Jobs in these states with ids after ``after`` ('' from the start), by id: one bounded
    step of a walk (the status index serves it)."""
    stmt = (
        sa.select(JobRow)
        .where(JobRow.status.in_([status.value for status in statuses]), JobRow.id > after)
        .order_by(JobRow.id)
        .limit(limit)
    )
    return [job_from_row(row) for row in session.scalars(stmt, execution_options=FRESH)]


def mark_result_fetched(session: Session, job_id: str, *, now: float) -> bool:
    """Stamp the first hand-out of a job's result; later calls change nothing (False)."""
    stmt = (
        sa.update(JOBS)
        .where(JOBS.c.id == job_id, JOBS.c.result_fetched_at.is_(None))
        .values(result_fetched_at=dt(now))
    )
    return rowcount(session, stmt) == 1
