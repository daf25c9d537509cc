"""The SQL of jobs: insert, read, list, and every state change of a job.

Functions take a ``Session`` first and never commit; the caller owns the transaction
(``with session.begin():``). They return domain values (``jobs.core.domain``), never ORM rows.

- A state change is one conditional ``UPDATE ... WHERE id = :id AND status = :src AND
  attempt = :attempt`` (``jobs.store.moves``, re-exported here); it happened iff exactly one
  row changed. A move not in ``jobs.core.states.TRANSITIONS`` raises ``IllegalTransition``
  before any SQL runs.
- A used idempotency key is an ``INSERT ... ON CONFLICT DO NOTHING`` that inserted nothing:
  ``insert_job`` returns None and the caller reads the job that holds it (only then, so a
  fresh key costs nothing more); the caller's transaction survives it. A taken tenant name
  is a unique violation caught inside a SAVEPOINT (on PostgreSQL a failed statement would
  otherwise abort the whole transaction), translated to ``InvalidRequest``.
- Reads refresh any row the session already holds (``populate_existing``): conditional
  UPDATEs bypass the identity map, so a cached row could otherwise be stale.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from jobs.core.domain import Job, JobSummary, NewJob
from jobs.core.pools import KindScope
from jobs.core.states import TERMINAL, Status
from jobs.store.direct import Runner, dialect_of
from jobs.store.models import (
    JobRow,
)
from jobs.store.moves import (
    TIME_FIELDS,
    TRANSITION_FIELDS,
    Claimed,
    claim,
    end_and_start,
    end_lost_start,
    landed,
    once_committed,
    start,
    started_by,
    transition,
    unstart_fields,
)
from jobs.store.rows import (
    FRESH,
    JOBS,
    dt,
    dt_or_none,
    job_from_row,
    rowcount,
    summary_from_columns,
)
from jobs.store.scope import EVERY_KIND, scoped
from jobs.store.search import JobQuery, search_jobs


def insert_job(session: Runner, new: NewJob) -> Job | None:
    """Insert a queued job, attempt 1; None when the tenant's idempotency key is held by an
    earlier job (the caller reads that job, ``job_by_idempotency_key``).

    One Core INSERT, no SAVEPOINT: a keyed insert says ``ON CONFLICT DO NOTHING`` on the
    (tenant, key) constraint, so losing a race to a concurrent submit of the same key neither
    aborts the caller's transaction (PostgreSQL) nor needs a unit-of-work flush to detect, and
    it is one statement on any runner, a direct connection's included."""
    values = _new_values(new)
    if new.idempotency_key is None:
        session.execute(_INSERT, values)
    elif session.execute(_keyed_insert(dialect_of(session)), values).first() is None:
        return None
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
        "timeout_s": new.timeout_s,
        "error_type": None,
        "retry_of": new.retry_of,
        "webhook_url": new.webhook_url,
        "webhook_events": new.webhook_events,
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


def states_of(
    session: Session, job_ids: Iterable[str]
) -> dict[str, tuple[Status, int, str]]:
    """The status, attempt and tenant of each of ``job_ids`` that exists, by id, in one
    query: what an index entry is checked against (and, to remove it, whose queue it is in),
    without reading the rows' payloads and results."""
    ids = list(job_ids)
    if not ids:
        return {}
    stmt = sa.select(JOBS.c.id, JOBS.c.status, JOBS.c.attempt, JOBS.c.tenant_id).where(
        JOBS.c.id.in_(ids))
    return {row.id: (Status(row.status), int(row.attempt), row.tenant_id)
            for row in session.execute(stmt)}


def kinds_of(session: Session, job_ids: Iterable[str]) -> dict[str, str]:
    """The kind of each of ``job_ids`` that exists, by id, in one query: where a dispatch of
    a pool routed by kind sends each job (``jobs.dispatch.routing``)."""
    ids = list(job_ids)
    if not ids:
        return {}
    stmt = sa.select(JOBS.c.id, JOBS.c.kind).where(JOBS.c.id.in_(ids))
    return {row.id: row.kind for row in session.execute(stmt)}


def count_by_kind(
    session: Session, kinds: Iterable[str], statuses: Iterable[Status]
) -> dict[str, int]:
    """How many jobs of each of ``kinds`` are in one of ``statuses`` (a kind with none is
    left out), read on the index of live rows: kinds waiting for a worker that runs them."""
    wanted, states = sorted(set(kinds)), [status.value for status in statuses]
    if not wanted or not states:
        return {}
    stmt = (sa.select(JOBS.c.kind, sa.func.count())
            .where(JOBS.c.status.in_(states), JOBS.c.kind.in_(wanted))
            .group_by(JOBS.c.kind))
    return {kind: int(count) for kind, count in session.execute(stmt)}


def list_jobs(
    session: Session,
    *,
    tenant_id: str,
    status: Status | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> tuple[list[Job], str | None]:
    """One page of the tenant's jobs, newest first, and the cursor of the next (None: last)."""
    return search_jobs(session, JobQuery(tenant_id=tenant_id, status=status), limit=limit,
                       cursor=cursor)


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


def queued_order(
    session: Session, tenant_id: str, scope: KindScope = EVERY_KIND
) -> list[tuple[float, str]]:
    """The tenant's queued jobs as ``(order_key, id)``, in dispatch order: how many of its own
    jobs are ahead of one of them (its estimate). Sorted here, not by SQL, so ids compare as
    bytes as in the index, whatever the database's collation."""
    stmt = scoped(sa.select(JobRow.order_key, JobRow.id).where(
        JobRow.tenant_id == tenant_id, JobRow.status == Status.QUEUED.value
    ), JobRow.kind, scope)
    return sorted((order_key, job_id) for order_key, job_id in session.execute(stmt))


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


@dataclass(frozen=True)
class Settled:
    """A queued row as the reconciler's walk reads it: what its index entry is checked
    against, and the walk's cursor; the rest of the row is read only if it must be indexed."""

    id: str
    attempt: int
    updated_at: float


def settled_queued(
    session: Session, *, after: tuple[float, str] | None, until: float, limit: int,
    scope: KindScope = EVERY_KIND,
) -> list[Settled]:
    """Queued jobs whose last change is at or before ``until``, in ``(updated_at, id)`` order
    after the cursor ``after`` (None: from the start): one bounded step of a walk."""
    stmt = scoped(sa.select(JOBS.c.id, JOBS.c.attempt, JOBS.c.updated_at).where(
        JOBS.c.status == Status.QUEUED.value, JOBS.c.updated_at <= dt(until)
    ), JOBS.c.kind, scope)
    if after is not None:
        at, job_id = dt(after[0]), after[1]
        stmt = stmt.where(
            sa.or_(JOBS.c.updated_at > at, sa.and_(JOBS.c.updated_at == at, JOBS.c.id > job_id))
        )
    stmt = stmt.order_by(JOBS.c.updated_at, JOBS.c.id).limit(limit)
    return [Settled(id=row.id, attempt=int(row.attempt), updated_at=row.updated_at.timestamp())
            for row in session.execute(stmt)]


def jobs_after(
    session: Session, statuses: Iterable[Status], *, after: str, limit: int,
    scope: KindScope = EVERY_KIND,
) -> list[Job]:
    """Jobs in these states with ids after ``after`` ('' from the start), by id: one bounded
    step of a walk (the status index serves it)."""
    stmt = (
        scoped(sa.select(JobRow), JobRow.kind, scope)
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


__all__ = [
    "TIME_FIELDS", "TRANSITION_FIELDS", "Claimed", "Settled", "claim", "end_and_start",
    "end_lost_start", "get_job", "get_jobs", "insert_job", "jobs_after", "jobs_in_status",
    "landed", "latest_jobs", "list_jobs", "mark_result_fetched", "once_committed", "queued_order",
    "request_cancel", "settled_queued", "start", "started_by", "transition", "unstart_fields",
]
