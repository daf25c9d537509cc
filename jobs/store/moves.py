"""Every state change of a job: the compare-and-set of a move, the claim, and a worker's start.

A state change is one conditional ``UPDATE ... WHERE id = :id AND status = :src AND attempt =
:attempt``; it happened iff exactly one row changed. A move not in
``jobs.core.states.TRANSITIONS`` raises ``IllegalTransition`` before any SQL runs. The
statements of the hot path (the start, each shape of move) are built once and bound with
parameters: building one costs more than running it. Functions take a ``Session`` or a Core
``Connection`` and never commit (``jobs.store.jobs`` re-exports them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobs.core.domain import Job
from jobs.core.errors import IllegalTransition
from jobs.core.states import NEW_ATTEMPT, Status, is_legal
from jobs.store.direct import DirectConnection, DirectPool, Runner, dialect_of
from jobs.store.models import JobRow
from jobs.store.rows import JOBS, dt, dt_or_none, epoch_or_none, job_from_row

TRANSITION_FIELDS = frozenset(
    {"result", "result_blob", "error", "error_type", "not_before", "cancel_requested",
     "max_attempts", "starts", "started_at", "progress", "run_cap"}
)


TIME_FIELDS = frozenset({"not_before", "started_at"})


def transition(
    session: Runner,
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

    ``fields`` may set ``result``, ``error``, ``error_type``, ``progress``, ``not_before``
    (epoch seconds), ``cancel_requested``, ``max_attempts``, and ``starts`` and
    ``started_at`` (a hand-back of a start whose handler never ran puts back the values
    from before it). False means
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
    session: Runner,
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
    params = _start_params("w", "v", job_id, attempt, now, token, dispatched_at)
    row = session.execute(_START, params).first()
    return None if row is None else job_from_row(cast(JobRow, row))


@contextlib.contextmanager
def once_committed(
    pool: DirectPool, job_id: str, *, wait_s: float
) -> Iterator[DirectConnection | None]:
    """A connection whose statements run once the submit of ``job_id`` has committed, if it
    is committing: a submit that finds a slot free has its job leased before its COMMIT,
    holding the job's commit lock (``jobs.admission.submit``), and this waits for that lock
    first (``DirectPool.await_commit``). Not durable, as a worker's start. None: the lock
    was not granted within ``wait_s`` (the submit hangs; the caller settles the job as a
    row not there)."""
    if not pool.await_commit(job_id, wait_s=wait_s):
        yield None
        return
    with pool.connection(durable=False) as connection:
        yield connection


def end_and_start(
    session: Runner,
    job_id: str,
    *,
    attempt: int,
    dst: Status,
    now: float,
    fields: dict[str, Any],
    next_id: str,
    next_attempt: int,
    token: str,
    dispatched_at: float | None,
) -> tuple[bool, Job | None]:
    """A slot's ending and its next job's start together: this attempt's move running →
    ``dst`` (``transition``, with ``fields``) and the start of ``next_id`` (``start``, under
    ``token``). One statement on PostgreSQL, so one round trip and one transaction (each
    sub-statement changes its own row, and both commit or neither does); two in the caller's
    transaction elsewhere. Returns whether the ending moved, and the next job's row if it
    started."""
    if dialect_of(session) != "postgresql":
        moved = transition(session, job_id, src=Status.RUNNING, attempt=attempt, dst=dst,
                           now=now, **fields)
        return moved, start(session, next_id, attempt=next_attempt, now=now, token=token,
                            dispatched_at=dispatched_at)
    if not is_legal(Status.RUNNING, dst) or set(fields) - TRANSITION_FIELDS:
        raise IllegalTransition(f"running -> {dst.value} with {sorted(fields)} is not an "
                                "ending", job_id=job_id)
    values = _transition_values(Status.RUNNING, attempt, dst, now, fields)
    stmt, names = _end_and_start_stmt(dst, tuple(values), values)
    params = {f"v_{name}": values[name] for name in names}
    params.update(w_id=job_id, w_status=Status.RUNNING.value, w_attempt=attempt)
    params.update(_start_params("n", "nv", next_id, next_attempt, now, token, dispatched_at))
    row = session.execute(stmt, params).first()
    started = None if row is None or row.id is None else job_from_row(cast(JobRow, row))
    return row is not None and int(row.ended_rows) == 1, started


def end_lost_start(
    session: Runner,
    job: Job,
    *,
    dst: Status,
    now: float,
    fields: dict[str, Any],
    token: str,
    dispatched_at: float | None,
) -> bool:
    """A start of ``job``'s attempt that was lost with its COMMIT made again as it was
    (``start``, under ``token``, at the row's ``started_at`` as the attempt read it), and
    the attempt's ending with it, in the caller's transaction: True iff both moved. Only a
    row queued at this attempt moves (not flagged to cancel, its ``start_by`` not passed at
    that start): one any other start, move or ending has touched stays as it is."""
    began = now if job.started_at is None else job.started_at
    if start(session, job.id, attempt=job.attempt, now=began, token=token,
             dispatched_at=dispatched_at) is None:
        return False
    return transition(session, job.id, src=Status.RUNNING, attempt=job.attempt, dst=dst,
                      now=now, **fields)


_END_AND_START: dict[tuple[Status, tuple[str, ...]], tuple[Any, tuple[str, ...]]] = {}


def _end_and_start_stmt(
    dst: Status, shape: tuple[str, ...], values: dict[str, Any]
) -> tuple[Any, tuple[str, ...]]:
    """``WITH ended AS (the ending's UPDATE), started AS (the start's UPDATE) SELECT`` how
    many rows ended, and the started row (NULLs when none), built once per shape."""
    key = (dst, shape)
    found = _END_AND_START.get(key)
    if found is None:
        ending, names = _transition_stmt(Status.RUNNING, dst, shape, values)
        ended = ending.returning(JOBS.c.id).cte("ended")
        started = _START_NEXT.cte("started")
        one = sa.select(sa.literal(1).label("one")).subquery("one")
        count = sa.select(sa.func.count()).select_from(ended).scalar_subquery()
        stmt = (sa.select(count.label("ended_rows"), *started.c)
                .select_from(one.outerjoin(started, sa.true())))
        found = _END_AND_START[key] = (stmt, names)
    return found


def _start_params(w: str, v: str, job_id: str, attempt: int, now: float, token: str | None,
                  dispatched_at: float | None) -> dict[str, Any]:
    at = dt(now)
    return {f"{w}_id": job_id, f"{w}_attempt": attempt, f"{v}_at": at, f"{v}_token": token,
            f"{v}_dispatched_at": at if dispatched_at is None else dt(dispatched_at)}


# What a worker's start moves from: a queued row (its lease is the claim), or a dispatched
# one (claimed in SQL by a dispatcher of an earlier version).
_STARTABLE = (Status.QUEUED.value, Status.DISPATCHED.value)


def _start_statement(w: str, v: str) -> Any:
    """The start's UPDATE, its parameters named ``<w>_id``, ``<w>_attempt``, ``<v>_at``,
    ``<v>_token`` and ``<v>_dispatched_at`` (two prefixes: it is also a part of
    ``end_and_start``, beside an UPDATE that names its own ``w_`` and ``v_``)."""
    at = sa.bindparam(f"{v}_at", type_=JOBS.c.started_at.type)
    return (
        sa.update(JOBS)
        .where(
            JOBS.c.id == sa.bindparam(f"{w}_id"),
            sa.or_(*(JOBS.c.status == status for status in _STARTABLE)),
            JOBS.c.attempt == sa.bindparam(f"{w}_attempt"),
            JOBS.c.cancel_requested.is_(False),
            sa.or_(JOBS.c.start_by.is_(None), JOBS.c.start_by > at),
        )
        .values(status=Status.RUNNING.value, started_at=at, starts=JOBS.c.starts + 1,
                updated_at=at, start_token=sa.bindparam(f"{v}_token"), run_items=None,
                dispatched_at=sa.func.coalesce(JOBS.c.dispatched_at, sa.bindparam(
                    f"{v}_dispatched_at", type_=JOBS.c.dispatched_at.type)))
        .returning(*JOBS.c)
    )


_START = _start_statement("w", "v")
_START_NEXT = _start_statement("n", "nv")


def started_by(
    session: Runner, job_id: str, *, attempt: int, token: str
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


def landed(session: Runner, job: Job, src: Status, dst: Status) -> bool:
    """This attempt's move to ``dst`` is already in the row (a new attempt for a requeue): a
    compare-and-set retried after its COMMIT's answer was lost."""
    row = session.execute(sa.select(JOBS.c.status, JOBS.c.attempt)
                          .where(JOBS.c.id == job.id)).first()
    if row is None or row.status != dst.value:
        return False
    expected = job.attempt + 1 if (src, dst) in NEW_ATTEMPT else job.attempt
    return int(row.attempt) == expected
