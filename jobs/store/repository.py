"""The job repository: every SQL statement tierq runs lives here.

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
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.core.domain import Job, JobSummary, NewJob, Tenant
from jobs.core.errors import DuplicateJob, IllegalTransition, InvalidRequest, Unavailable
from jobs.core.states import NEW_ATTEMPT, TERMINAL, Status, is_legal
from jobs.store.models import (
    BlobRow,
    IndexStateRow,
    JobRow,
    JobTombstoneRow,
    LeadershipRow,
    RetentionTotalRow,
    TenantRow,
)

# The jobs table for Core statements: the state changes of the hot path (claim, start, a
# transition) skip the ORM's per-statement work, which costs more than the SQL itself.
JOBS = cast(sa.Table, JobRow.__table__)
TOMBSTONES = cast(sa.Table, JobTombstoneRow.__table__)
TOTALS = cast(sa.Table, RetentionTotalRow.__table__)

# Refresh rows the session already holds (see the module docstring).
FRESH: Mapping[str, Any] = {"populate_existing": True}

TENANT_FIELDS = frozenset({"tier", "api_key_hash", "cap", "max_queued", "rate_per_s", "rate_burst"})
TRANSITION_FIELDS = frozenset(
    {"result", "result_blob", "error", "not_before", "cancel_requested", "max_attempts", "starts",
     "started_at"}
)
TIME_FIELDS = frozenset({"not_before", "started_at"})


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def _dt_or_none(epoch: float | None) -> datetime | None:
    return None if epoch is None else _dt(epoch)


def _epoch_or_none(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def _rowcount(session: Session, stmt: sa.Update) -> int:
    stmt = stmt.execution_options(synchronize_session=False)
    result = cast(CursorResult[Any], session.execute(stmt))
    return result.rowcount


# -- tenants ---------------------------------------------------------------------------------


def create_tenant(
    session: Session, *, name: str, tier: str, api_key_hash: str, now: float
) -> Tenant:
    row = TenantRow(
        id=str(uuid.uuid4()), name=name, tier=tier, api_key_hash=api_key_hash, created_at=_dt(now)
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        if tenant_by_name(session, name) is None:
            raise
        raise InvalidRequest(f"a tenant named {name!r} already exists", name=name) from None
    return Tenant.from_row(row)


def get_tenant(session: Session, tenant_id: str) -> Tenant | None:
    return _tenant_where(session, TenantRow.id == tenant_id)


def tenant_by_name(session: Session, name: str) -> Tenant | None:
    return _tenant_where(session, TenantRow.name == name)


def tenant_by_key_hash(session: Session, key_hash: str) -> Tenant | None:
    return _tenant_where(session, TenantRow.api_key_hash == key_hash)


def _tenant_where(session: Session, criterion: sa.ColumnElement[bool]) -> Tenant | None:
    stmt = sa.select(TenantRow).where(criterion).limit(1)
    row = session.scalars(stmt, execution_options=FRESH).first()
    return None if row is None else Tenant.from_row(row)


def list_tenants(session: Session) -> list[Tenant]:
    rows = session.scalars(sa.select(TenantRow).order_by(TenantRow.name), execution_options=FRESH)
    return [Tenant.from_row(row) for row in rows]


def tenants_by_ids(session: Session, tenant_ids: Iterable[str]) -> dict[str, Tenant]:
    """The tenants of these ids that exist, by id (one query, by primary key)."""
    ids = sorted(set(tenant_ids))
    if not ids:
        return {}
    stmt = sa.select(TenantRow).where(TenantRow.id.in_(ids))
    return {row.id: Tenant.from_row(row)
            for row in session.scalars(stmt, execution_options=FRESH)}


def update_tenant(
    session: Session, tenant_id: str, **fields: str | int | float | None
) -> Tenant | None:
    """Change the tier, the key hash or the overrides; None when there is no such tenant."""
    unknown = set(fields) - TENANT_FIELDS
    if unknown:
        raise TypeError(f"update_tenant() got unexpected fields {sorted(unknown)}")
    if fields:
        stmt = sa.update(TenantRow).where(TenantRow.id == tenant_id).values(**fields)
        if _rowcount(session, stmt) != 1:
            return None
    return get_tenant(session, tenant_id)


# -- jobs: insert and read -------------------------------------------------------------------


def insert_job(session: Session, new: NewJob) -> Job:
    """Insert a queued job, attempt 1. A used idempotency key raises ``DuplicateJob``.

    One Core INSERT, no SAVEPOINT: a keyed insert says ``ON CONFLICT DO NOTHING`` on the
    (tenant, key) constraint, so losing a race to a concurrent submit of the same key neither
    aborts the caller's transaction (PostgreSQL) nor needs a unit-of-work flush to detect."""
    values = _new_values(new)
    if new.idempotency_key is None:
        session.execute(sa.insert(JOBS).values(values))
    else:
        stmt = _insert(session).values(values).on_conflict_do_nothing(
            index_elements=[JOBS.c.tenant_id, JOBS.c.idempotency_key]
        ).returning(JOBS.c.id)
        if session.execute(stmt).first() is None:
            existing = job_by_idempotency_key(session, new.tenant_id, new.idempotency_key)
            if existing is None:  # the winner's row vanished (pruned) in between
                raise Unavailable("the job with this idempotency key moved; retry")
            raise DuplicateJob("this idempotency key was already used by this tenant",
                               job=existing)
    return Job.from_row(cast(JobRow, SimpleNamespace(**values)))  # no ORM instance to build


def _insert(session: Session) -> Any:
    """The dialect's INSERT, which knows ``ON CONFLICT`` (PostgreSQL and SQLite spell it alike)."""
    if session.get_bind().dialect.name == "postgresql":
        return pg_insert(JOBS)
    return sqlite_insert(JOBS)


def _new_values(new: NewJob) -> dict[str, Any]:
    created_at = _dt(new.enqueued_at if new.created_at is None else new.created_at)
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
        "enqueued_at": _dt(new.enqueued_at),
        "max_wait_s": new.max_wait_s,
        "start_by": _dt_or_none(new.start_by),
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
    return None if row is None else Job.from_row(row)


def get_job(session: Session, job_id: str, *, tenant_id: str | None = None) -> Job | None:
    """The job; with ``tenant_id``, another tenant's job is None (never "forbidden")."""
    stmt = sa.select(JobRow).where(JobRow.id == job_id)
    if tenant_id is not None:
        stmt = stmt.where(JobRow.tenant_id == tenant_id)
    row = session.scalars(stmt.limit(1), execution_options=FRESH).first()
    return None if row is None else Job.from_row(row)


def get_jobs(session: Session, job_ids: Iterable[str]) -> dict[str, Job]:
    """The jobs among ``job_ids`` that exist, by id, in one query (a dispatch batch)."""
    ids = list(job_ids)
    if not ids:
        return {}
    stmt = sa.select(JobRow).where(JobRow.id.in_(ids))
    return {row.id: Job.from_row(row) for row in session.scalars(stmt, execution_options=FRESH)}


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
    page = [Job.from_row(row) for row in rows[:limit]]
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
        JobSummary.from_columns(id=id_, kind=kind, tier=tier, status=status,
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


# -- jobs: state changes ---------------------------------------------------------------------


def transition(
    session: Session,
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
    stmt = (
        sa.update(JOBS)
        .where(JOBS.c.id == job_id, JOBS.c.status == src.value, JOBS.c.attempt == attempt)
        .values(_transition_values(src, attempt, dst, now, fields))
    )
    return _rowcount(session, stmt) == 1


def _transition_values(
    src: Status, attempt: int, dst: Status, now: float, fields: dict[str, Any]
) -> dict[str, Any]:
    values: dict[str, Any] = {"status": dst.value, "updated_at": _dt(now)}
    if dst is Status.DISPATCHED:
        values["dispatched_at"] = _dt(now)
    elif dst is Status.RUNNING:
        values.update(started_at=_dt(now), starts=JOBS.c.starts + 1)
    elif dst.terminal:
        values["finished_at"] = _dt(now)
    if (src, dst) in NEW_ATTEMPT:
        # started_at stays: the client can tell a job that ran from one that never did.
        values.update(attempt=attempt + 1, dispatched_at=None)
    for name, value in fields.items():
        values[name] = _dt_or_none(value) if name in TIME_FIELDS else value
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
    at = _dt(now)
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
                        order_key=row.order_key, start_by=_epoch_or_none(row.start_by))
        for row in session.execute(stmt)
    }


def start(session: Session, job_id: str, *, attempt: int, now: float) -> Job | None:
    """Compare-and-set ``dispatched`` → ``running`` for this attempt and return the row, in
    one statement: a worker's start. Only a job that may start starts: not flagged to cancel,
    its ``start_by`` not passed. None: it did not move (stale, cancelled or late: the caller
    reads the row to tell which)."""
    at = _dt(now)
    stmt = (
        sa.update(JOBS)
        .where(
            JOBS.c.id == job_id,
            JOBS.c.status == Status.DISPATCHED.value,
            JOBS.c.attempt == attempt,
            JOBS.c.cancel_requested.is_(False),
            sa.or_(JOBS.c.start_by.is_(None), JOBS.c.start_by > at),
        )
        .values(status=Status.RUNNING.value, started_at=at, starts=JOBS.c.starts + 1,
                updated_at=at)
        .returning(*JOBS.c)
    )
    row = session.execute(stmt).first()
    return None if row is None else Job.from_row(cast(JobRow, row))


def request_cancel(session: Session, job_id: str) -> bool:
    """Flag a job that has not finished for cancellation; False when it has (or is unknown)."""
    stmt = (
        sa.update(JOBS)
        .where(JOBS.c.id == job_id, JOBS.c.status.not_in([s.value for s in TERMINAL]))
        .values(cancel_requested=True)
    )
    return _rowcount(session, stmt) == 1


# -- jobs: bulk reads for the index rebuild and metrics --------------------------------------


def jobs_in_status(session: Session, statuses: Iterable[Status]) -> list[Job]:
    """Jobs in these states in dispatch order (``order_key``, then id): rebuilds the index."""
    values = [status.value for status in statuses]
    stmt = sa.select(JobRow).where(JobRow.status.in_(values)).order_by(JobRow.order_key, JobRow.id)
    return [Job.from_row(row) for row in session.scalars(stmt, execution_options=FRESH)]


LIVE = (Status.WAITING, Status.QUEUED, Status.DISPATCHED, Status.RUNNING)


def count_live(session: Session) -> dict[Status, int]:
    """Jobs in each live state (waiting, queued, dispatched, running; 0 included): a range of the
    index on ``(status, ...)``, as long as the live jobs, never the whole table."""
    counts = dict.fromkeys(LIVE, 0)
    stmt = (sa.select(JobRow.status, sa.func.count())
            .where(JobRow.status.in_([status.value for status in LIVE]))
            .group_by(JobRow.status))
    for status, count in session.execute(stmt):
        counts[Status(status)] = count
    return counts


def count_by_status(session: Session) -> dict[Status, int]:
    """Every state with its number of jobs (0 included)."""
    counts = dict.fromkeys(Status, 0)
    stmt = sa.select(JobRow.status, sa.func.count()).group_by(JobRow.status)
    for status, count in session.execute(stmt):
        counts[Status(status)] = count
    return counts


def recent_service_times(session: Session, *, limit: int) -> list[float]:
    """Run time (finished - started) of the last ``limit`` finished runs, newest first."""
    stmt = (
        sa.select(JobRow.started_at, JobRow.finished_at)
        .where(
            JobRow.status.in_([Status.SUCCEEDED.value, Status.FAILED.value]),
            JobRow.started_at.is_not(None),
            JobRow.finished_at.is_not(None),
        )
        .order_by(JobRow.finished_at.desc(), JobRow.id.desc())
        .limit(limit)
    )
    return [
        (finished - started).total_seconds()
        for started, finished in session.execute(stmt)
        if started is not None and finished is not None
    ]


def recent_waits(session: Session, *, tier: str, since: float) -> list[float]:
    """Queue wait (started - enqueued) of the tier's jobs that started at or after ``since``."""
    stmt = (
        sa.select(JobRow.enqueued_at, JobRow.started_at)
        .where(JobRow.tier == tier, JobRow.started_at >= _dt(since))
        .order_by(JobRow.started_at)
    )
    return [
        (started - enqueued).total_seconds()
        for enqueued, started in session.execute(stmt)
        if started is not None
    ]


# -- the reconciler's reads and the index epoch -----------------------------------------------


def settled_queued(
    session: Session, *, after: tuple[float, str] | None, until: float, limit: int
) -> list[Job]:
    """Queued jobs whose last change is at or before ``until``, in ``(updated_at, id)`` order
    after the cursor ``after`` (None: from the start): one bounded step of a walk."""
    stmt = sa.select(JobRow).where(
        JobRow.status == Status.QUEUED.value, JobRow.updated_at <= _dt(until)
    )
    if after is not None:
        at, job_id = _dt(after[0]), after[1]
        stmt = stmt.where(
            sa.or_(JobRow.updated_at > at, sa.and_(JobRow.updated_at == at, JobRow.id > job_id))
        )
    stmt = stmt.order_by(JobRow.updated_at, JobRow.id).limit(limit)
    return [Job.from_row(row) for row in session.scalars(stmt, execution_options=FRESH)]


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
    return [Job.from_row(row) for row in session.scalars(stmt, execution_options=FRESH)]


def index_epoch(session: Session) -> int | None:
    """The epoch SQL holds for the index (None before the first reconciler round)."""
    row = session.get(IndexStateRow, 1, populate_existing=True)
    return None if row is None else row.epoch


def advance_epoch(session: Session, *, expected: int | None, epoch: int) -> bool:
    """Compare-and-set the index epoch from ``expected`` to ``epoch``; True iff it moved."""
    if expected is None:
        try:
            with session.begin_nested():
                session.add(IndexStateRow(id=1, epoch=epoch))
        except IntegrityError:
            return False
        return True
    stmt = (
        sa.update(IndexStateRow)
        .where(IndexStateRow.id == 1, IndexStateRow.epoch == expected)
        .values(epoch=epoch)
    )
    return _rowcount(session, stmt) == 1


# -- blobs -------------------------------------------------------------------------------------


def record_blob(session: Session, sha256: str, *, size: int, now: float) -> None:
    """Record a blob about to be written (again): its grace starts over. Waits for a pruner
    holding the row, so a blob is never deleted under a writer that recorded it."""
    values = {"sha256": sha256, "bytes": size, "stored_at": _dt(now)}
    insert = (pg_insert(BlobRow) if session.get_bind().dialect.name == "postgresql"
              else sqlite_insert(BlobRow))
    session.execute(insert.values(values).on_conflict_do_update(
        index_elements=[BlobRow.sha256], set_={"stored_at": values["stored_at"]}))


def take_unreferenced_blobs(session: Session, *, before: float, limit: int) -> list[str]:
    """Blobs stored before ``before`` that no job names, oldest first, locked until the
    caller's transaction ends (PostgreSQL: rows another pruner holds are skipped)."""
    named = sa.or_(
        sa.exists().where(JOBS.c.blob == BlobRow.sha256),
        sa.exists().where(JOBS.c.result_blob == BlobRow.sha256),
    )
    stmt = (
        sa.select(BlobRow.sha256)
        .where(BlobRow.stored_at < _dt(before), ~named)
        .order_by(BlobRow.stored_at)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return list(session.scalars(stmt))


def blob_size(session: Session, sha256: str) -> int | None:
    row = session.get(BlobRow, sha256)
    return None if row is None else row.bytes


def forget_blobs(session: Session, digests: Sequence[str]) -> None:
    if digests:
        session.execute(sa.delete(BlobRow).where(BlobRow.sha256.in_(list(digests))))


# -- the leader's claim ------------------------------------------------------------------------


def claim_lead(session: Session, token: str) -> None:
    """Name ``token`` the leader in SQL. Waits for a deposed leader's decision in progress
    (it holds the row), so what the caller reads afterwards includes it."""
    stmt = sa.update(LeadershipRow).where(LeadershipRow.id == 1).values(holder=token)
    if _rowcount(session, stmt) == 0:
        session.add(LeadershipRow(id=1, holder=token))
        session.flush()


def holds_lead(session: Session, token: str) -> bool:
    """True while SQL names ``token`` the leader; holds the row until the caller's
    transaction ends, so no successor claims SQL while the caller decides."""
    stmt = (
        sa.update(LeadershipRow)
        .where(LeadershipRow.id == 1, LeadershipRow.holder == token)
        .values(holder=token)
    )
    return _rowcount(session, stmt) == 1


# -- retention: results fetched, finished jobs pruned, tombstones ------------------------------


def mark_result_fetched(session: Session, job_id: str, *, now: float) -> bool:
    """Stamp the first hand-out of a job's result; later calls change nothing (False)."""
    stmt = (
        sa.update(JOBS)
        .where(JOBS.c.id == job_id, JOBS.c.result_fetched_at.is_(None))
        .values(result_fetched_at=_dt(now))
    )
    return _rowcount(session, stmt) == 1


@dataclass(frozen=True, kw_only=True)
class Pruned:
    """What a prune removed from one tier: how many jobs, and how many of them were
    abandoned (succeeded, the result never fetched)."""

    tier: str
    pruned: int
    abandoned: int


def prune_finished(session: Session, *, tier: str, before: float, limit: int,
                   now: float) -> Pruned:
    """Delete up to ``limit`` of the tier's jobs that finished before ``before``, oldest
    first, leave a tombstone for each and add them to the tier's totals.

    Two bounded statements: ``SELECT id ... ORDER BY finished_at LIMIT n`` (the tier's
    finished-at index), then ``DELETE ... WHERE id IN (<those ids>) RETURNING`` (the primary
    key). As one ``DELETE ... WHERE id IN (SELECT ...)`` PostgreSQL may plan a hash join
    over the whole table. A finished row never changes state, and one another pruner took
    in between is not returned, so nothing is counted twice."""
    due = (
        sa.select(JOBS.c.id)
        .where(JOBS.c.tier == tier,
               # As a row value, only the (tier, finished_at) index can serve the range:
               # walked by finished_at alone, other tiers' older rows would be read first.
               sa.tuple_(JOBS.c.tier, JOBS.c.finished_at) < sa.tuple_(tier, _dt(before)),
               JOBS.c.status.in_([status.value for status in TERMINAL]))
        .order_by(JOBS.c.tier, JOBS.c.finished_at)
        .limit(limit)
    )
    ids = list(session.scalars(due))
    if not ids:
        return Pruned(tier=tier, pruned=0, abandoned=0)
    stmt = sa.delete(JOBS).where(JOBS.c.id.in_(ids)).returning(
        JOBS.c.id, JOBS.c.tenant_id, JOBS.c.status, JOBS.c.result_fetched_at
    )
    rows = session.execute(stmt.execution_options(synchronize_session=False)).all()
    if not rows:
        return Pruned(tier=tier, pruned=0, abandoned=0)
    at = _dt(now)
    session.execute(sa.insert(TOMBSTONES), [
        {"id": row.id, "tenant_id": row.tenant_id, "tier": tier, "pruned_at": at}
        for row in rows
    ])
    abandoned = sum(1 for row in rows
                    if row.status == Status.SUCCEEDED.value and row.result_fetched_at is None)
    _add_totals(session, tier, pruned=len(rows), abandoned=abandoned)
    return Pruned(tier=tier, pruned=len(rows), abandoned=abandoned)


def _add_totals(session: Session, tier: str, *, pruned: int, abandoned: int) -> None:
    """Add to the tier's counters (an upsert: the first prune of a tier makes its row)."""
    insert = pg_insert(TOTALS) if _dialect(session) == "postgresql" else sqlite_insert(TOTALS)
    stmt = insert.values(tier=tier, pruned=pruned, abandoned=abandoned)
    stmt = stmt.on_conflict_do_update(
        index_elements=[TOTALS.c.tier],
        set_={"pruned": TOTALS.c.pruned + pruned, "abandoned": TOTALS.c.abandoned + abandoned},
    )
    session.execute(stmt)


def _dialect(session: Session) -> str:
    return session.get_bind().dialect.name


def prune_tombstones(session: Session, *, tier: str, before: float, limit: int) -> int:
    """Delete up to ``limit`` of the tier's tombstones made before ``before``, oldest first:
    past that, a pruned job's id is answered ``404`` like one that never was."""
    due = (
        sa.select(TOMBSTONES.c.id)
        .where(TOMBSTONES.c.tier == tier, TOMBSTONES.c.pruned_at < _dt(before))
        .order_by(TOMBSTONES.c.pruned_at)
        .limit(limit)
    )
    ids = list(session.scalars(due))
    if not ids:
        return 0
    stmt = sa.delete(TOMBSTONES).where(TOMBSTONES.c.id.in_(ids))
    result = cast(CursorResult[Any],
                  session.execute(stmt.execution_options(synchronize_session=False)))
    return result.rowcount


def was_pruned(session: Session, job_id: str, *, tenant_id: str) -> bool:
    """True when this tenant's job was pruned (another tenant's: False, as for any id)."""
    stmt = sa.select(TOMBSTONES.c.id).where(
        TOMBSTONES.c.id == job_id, TOMBSTONES.c.tenant_id == tenant_id
    )
    return session.execute(stmt.limit(1)).first() is not None


def retention_totals(session: Session) -> dict[str, tuple[int, int]]:
    """Per tier, ``(pruned, abandoned)`` since the start (tiers never pruned are absent)."""
    stmt = sa.select(TOTALS.c.tier, TOTALS.c.pruned, TOTALS.c.abandoned)
    return {tier: (pruned, abandoned) for tier, pruned, abandoned in session.execute(stmt)}
