"""SQL of batches: the batch row, its items (``jobs`` rows with ``batch_id``), their counts.

As everywhere in ``jobs.store``, functions take a ``Session`` and never commit. Items are
inserted in chunks of ``INSERT_CHUNK`` rows (one executemany each), so a 100,000-item batch
is a few hundred statements inside its one transaction. Every state change of an item is
conditional on its status, as every other job change is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.core.domain import Job
from jobs.core.pools import KindScope
from jobs.core.states import TERMINAL, Status
from jobs.core.webhooks import Webhook, events_of
from jobs.store import webhooks
from jobs.store.models import BatchRow, JobRow
from jobs.store.rows import job_from_row
from jobs.store.scope import EVERY_KIND, scoped

JOBS = cast(sa.Table, JobRow.__table__)
BATCHES = cast(sa.Table, BatchRow.__table__)
INSERT_CHUNK = 1000


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


@dataclass(frozen=True, kw_only=True)
class Batch:
    id: str
    tenant_id: str
    tier: str
    kind: str
    total: int
    max_attempts: int
    idempotency_key: str | None
    content_hash: str
    timeout_s: float | None = None
    completion_window_s: float | None = None
    cancelled: bool
    created_at: float
    # Its webhook: the URL and its events as stored (``jobs.core.webhooks.events_column``).
    webhook_url: str | None = None
    webhook_events: str | None = None

    @property
    def item_webhook(self) -> tuple[str | None, str | None]:
        """The webhook columns of its items: its URL and what they report for it."""
        if self.webhook_url is None:
            return None, None
        marks = Webhook.of_batch(self.webhook_url, events_of(self.webhook_events))
        return (self.webhook_url, marks.column) if marks.events else (None, None)

    @property
    def start_by(self) -> float | None:
        """Its items not started by then end expired (None: no window)."""
        window = self.completion_window_s
        return None if window is None else self.created_at + window

    @classmethod
    def from_row(cls, row: Any) -> Batch:
        return cls(
            id=row.id, tenant_id=row.tenant_id, tier=row.tier, kind=row.kind, total=row.total,
            max_attempts=row.max_attempts, idempotency_key=row.idempotency_key,
            content_hash=row.content_hash, cancelled=row.cancelled,
            created_at=row.created_at.timestamp(), timeout_s=getattr(row, "timeout_s", None),
            completion_window_s=getattr(row, "completion_window_s", None),
            webhook_url=getattr(row, "webhook_url", None),
            webhook_events=getattr(row, "webhook_events", None),
        )


@dataclass(frozen=True, kw_only=True)
class WaitingItem:
    job_id: str
    tenant_id: str
    tier: str
    batch_index: int
    start_by: float | None = None


def insert_batch(session: Session, batch: Batch) -> bool:
    """Insert the batch row; False when its tenant already used its idempotency key (the
    failed INSERT ran in a SAVEPOINT, so the caller's transaction goes on)."""
    try:
        with session.begin_nested():
            session.execute(sa.insert(BATCHES).values(
                id=batch.id, tenant_id=batch.tenant_id, tier=batch.tier, kind=batch.kind,
                total=batch.total, max_attempts=batch.max_attempts,
                idempotency_key=batch.idempotency_key, content_hash=batch.content_hash,
                cancelled=False, created_at=_dt(batch.created_at), timeout_s=batch.timeout_s,
                completion_window_s=batch.completion_window_s,
                webhook_url=batch.webhook_url, webhook_events=batch.webhook_events,
                open_items=batch.total,
            ))
    except IntegrityError:
        return False
    return True


def insert_items(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Insert waiting items (values as built by ``item_values``), one executemany per chunk."""
    for start in range(0, len(rows), INSERT_CHUNK):
        session.execute(sa.insert(JOBS), list(rows[start:start + INSERT_CHUNK]))


def item_values(
    *, job_id: str, batch: Batch, index: int, payload: dict[str, Any], now: float,
    custom_id: str | None = None,
) -> dict[str, Any]:
    at = _dt(now)
    start_by = batch.start_by
    webhook_url, webhook_events = batch.item_webhook
    return {
        "id": job_id, "tenant_id": batch.tenant_id, "tier": batch.tier, "kind": batch.kind,
        "payload": payload, "status": Status.WAITING.value, "attempt": 1,
        "max_attempts": batch.max_attempts, "order_key": 0.0, "created_at": at,
        "enqueued_at": at, "max_wait_s": None, "not_before": None,
        "start_by": None if start_by is None else _dt(start_by), "custom_id": custom_id,
        "dispatched_at": None, "started_at": None, "finished_at": None, "result": None,
        "error": None, "idempotency_key": None, "cancel_requested": False, "starts": 0,
        "updated_at": at, "batch_id": batch.id, "batch_index": index,
        "timeout_s": batch.timeout_s, "webhook_url": webhook_url,
        "webhook_events": webhook_events,
    }


def get_batch(session: Session, batch_id: str, *, tenant_id: str | None = None) -> Batch | None:
    stmt = sa.select(BATCHES).where(BATCHES.c.id == batch_id)
    if tenant_id is not None:
        stmt = stmt.where(BATCHES.c.tenant_id == tenant_id)
    row = session.execute(stmt).first()
    return None if row is None else Batch.from_row(row)


def batch_by_idempotency_key(session: Session, tenant_id: str, key: str) -> Batch | None:
    row = session.execute(sa.select(BATCHES).where(
        BATCHES.c.tenant_id == tenant_id, BATCHES.c.idempotency_key == key)).first()
    return None if row is None else Batch.from_row(row)


def list_batches(session: Session, tenant_id: str, *, limit: int) -> list[Batch]:
    """Newest first (batch ids are time-ordered)."""
    rows = session.execute(
        sa.select(BATCHES).where(BATCHES.c.tenant_id == tenant_id)
        .order_by(BATCHES.c.id.desc()).limit(limit)).all()
    return [Batch.from_row(row) for row in rows]


def counts(session: Session, batch_id: str) -> dict[Status, int]:
    rows = session.execute(
        sa.select(JOBS.c.status, sa.func.count()).where(JOBS.c.batch_id == batch_id)
        .group_by(JOBS.c.status)).all()
    return {Status(status): int(n) for status, n in rows}


def finished_span(session: Session, batch_id: str) -> tuple[float | None, float | None]:
    """The first start and the last finish among the batch's items (None: none yet)."""
    row = session.execute(
        sa.select(sa.func.min(JOBS.c.started_at), sa.func.max(JOBS.c.finished_at))
        .where(JOBS.c.batch_id == batch_id)).one()
    first, last = row
    return (_epoch(first), _epoch(last))


def _epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def finished_items(
    session: Session, batch_id: str, *, after: int, limit: int, failed_only: bool = False
) -> list[Job]:
    """Finished items past index ``after``, in index order; ``failed_only``: those that did
    not succeed."""
    ended = [status.value for status in TERMINAL
             if not (failed_only and status is Status.SUCCEEDED)]
    rows = session.scalars(
        sa.select(JobRow).where(
            JobRow.batch_id == batch_id, JobRow.batch_index > after, JobRow.status.in_(ended),
        ).order_by(JobRow.batch_index).limit(limit)).all()
    return [job_from_row(row) for row in rows]


def item_index(session: Session, job_ids: Iterable[str]) -> dict[str, int]:
    rows = session.execute(sa.select(JOBS.c.id, JOBS.c.batch_index)
                           .where(JOBS.c.id.in_(list(job_ids)))).all()
    return {job_id: int(index) for job_id, index in rows if index is not None}


def open_batches(session: Session, tenant_id: str) -> int:
    """The tenant's batches that still hold waiting items."""
    return int(session.execute(
        sa.select(sa.func.count(sa.distinct(JOBS.c.batch_id))).where(
            JOBS.c.tenant_id == tenant_id, JOBS.c.status == Status.WAITING.value)).scalar_one())


def batches_with_waiting(
    session: Session, *, limit: int, scope: KindScope = EVERY_KIND
) -> list[str]:
    """Batches that still hold waiting items (of the kinds of ``scope``), oldest first."""
    rows = session.execute(
        scoped(sa.select(JOBS.c.batch_id), JOBS.c.kind, scope)
        .where(JOBS.c.status == Status.WAITING.value)
        .group_by(JOBS.c.batch_id).order_by(JOBS.c.batch_id).limit(limit)).all()
    return [row[0] for row in rows if row[0] is not None]


def next_waiting(session: Session, batch_id: str, *, limit: int) -> list[WaitingItem]:
    rows = session.execute(
        sa.select(JOBS.c.id, JOBS.c.tenant_id, JOBS.c.tier, JOBS.c.batch_index,
                  JOBS.c.start_by).where(
            JOBS.c.status == Status.WAITING.value, JOBS.c.batch_id == batch_id,
        ).order_by(JOBS.c.batch_index).limit(limit)).all()
    return [WaitingItem(job_id=r[0], tenant_id=r[1], tier=r[2], batch_index=r[3],
                        start_by=None if r[4] is None else _epoch(r[4])) for r in rows]


def expire_waiting(session: Session, batch_id: str, *, now: float) -> int:
    """waiting → expired for the batch's items whose window passed before they were let in;
    the number moved."""
    at = _dt(now)
    result = session.execute(
        sa.update(JOBS).where(JOBS.c.batch_id == batch_id,
                              JOBS.c.status == Status.WAITING.value,
                              JOBS.c.start_by.is_not(None), JOBS.c.start_by <= at)
        .values(status=Status.EXPIRED.value, finished_at=at, updated_at=at,
                error="the batch's completion window passed before the item started",
                error_type="deadline"))
    return int(cast(Any, result).rowcount)


def admit_items(
    session: Session, job_ids: Sequence[str], *, order_key: float, now: float
) -> int:
    """waiting → queued for these items, their ageing starting now; the number moved."""
    if not job_ids:
        return 0
    at = _dt(now)
    result = session.execute(
        sa.update(JOBS).where(JOBS.c.id.in_(list(job_ids)),
                              JOBS.c.status == Status.WAITING.value)
        .values(status=Status.QUEUED.value, enqueued_at=at, order_key=order_key, updated_at=at))
    return int(cast(Any, result).rowcount)


def cancel_waiting(session: Session, batch_id: str, *, now: float) -> int:
    """waiting → cancelled for every waiting item of the batch; the number moved."""
    at = _dt(now)
    result = session.execute(
        sa.update(JOBS).where(JOBS.c.batch_id == batch_id,
                              JOBS.c.status == Status.WAITING.value)
        .values(status=Status.CANCELLED.value, finished_at=at, updated_at=at))
    session.execute(sa.update(BATCHES).where(BATCHES.c.id == batch_id).values(cancelled=True))
    return int(cast(Any, result).rowcount)


def live_items(session: Session, batch_id: str) -> list[Job]:
    """Items queued or in flight (at most the tenant's quota and cap): cancelled one by one."""
    rows = session.scalars(sa.select(JobRow).where(
        JobRow.batch_id == batch_id,
        JobRow.status.in_([Status.QUEUED.value, Status.DISPATCHED.value, Status.RUNNING.value]),
    )).all()
    return [job_from_row(row) for row in rows]


def prune_emptied(session: Session, *, tier: str, before: float, limit: int) -> int:
    """Delete up to ``limit`` of the tier's batches created before ``before`` whose items
    have all been pruned (``jobs.dispatch.retention``): a batch outlives none of its items."""
    items = sa.select(JOBS.c.id).where(JOBS.c.batch_id == BATCHES.c.id)
    due = (
        sa.select(BATCHES.c.id)
        .where(BATCHES.c.tier == tier, BATCHES.c.created_at < _dt(before), ~items.exists())
        .order_by(BATCHES.c.created_at)
        .limit(limit)
    )
    ids = list(session.scalars(due))
    if not ids:
        return 0
    webhooks.forget(session, batch_ids=ids)
    session.execute(sa.delete(BATCHES).where(BATCHES.c.id.in_(ids))
                    .execution_options(synchronize_session=False))
    return len(ids)
