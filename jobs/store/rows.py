"""Row ↔ value: the tables for Core statements, time columns as epochs, and the ORM rows
turned into domain values (``jobs.core.domain``), which never see an ORM class."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from jobs.core.domain import Job, JobSummary, Tenant
from jobs.core.states import Status
from jobs.store.models import (
    JobRow,
    JobTombstoneRow,
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


def dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def dt_or_none(epoch: float | None) -> datetime | None:
    return None if epoch is None else dt(epoch)


def epoch_or_none(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def rowcount(session: Session, stmt: sa.Update) -> int:
    stmt = stmt.execution_options(synchronize_session=False)
    result = cast(CursorResult[Any], session.execute(stmt))
    return result.rowcount


def dialect(session: Session) -> str:
    return session.get_bind().dialect.name


def epoch_required(at: datetime) -> float:
    return at.timestamp()


def tenant_from_row(row: TenantRow) -> Tenant:
    return Tenant(
        id=row.id,
        name=row.name,
        tier=row.tier,
        api_key_hash=row.api_key_hash,
        created_at=epoch_required(row.created_at),
        cap=row.cap,
        max_queued=row.max_queued,
        rate_per_s=row.rate_per_s,
        rate_burst=row.rate_burst,
    )


def job_from_row(row: JobRow) -> Job:
    return Job(
        id=row.id,
        tenant_id=row.tenant_id,
        tier=row.tier,
        kind=row.kind,
        payload=row.payload,
        status=Status(row.status),
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        order_key=row.order_key,
        created_at=epoch_required(row.created_at),
        enqueued_at=epoch_required(row.enqueued_at),
        max_wait_s=row.max_wait_s,
        start_by=epoch_or_none(row.start_by),
        not_before=epoch_or_none(row.not_before),
        dispatched_at=epoch_or_none(row.dispatched_at),
        started_at=epoch_or_none(row.started_at),
        finished_at=epoch_or_none(row.finished_at),
        result=row.result,
        error=row.error,
        idempotency_key=row.idempotency_key,
        cancel_requested=row.cancel_requested,
        starts=row.starts,
        updated_at=epoch_or_none(row.updated_at),
        result_fetched_at=epoch_or_none(row.result_fetched_at),
        batch_id=getattr(row, "batch_id", None),
        batch_index=getattr(row, "batch_index", None),
        blob=getattr(row, "blob", None),
        result_blob=getattr(row, "result_blob", None),
        timeout_s=getattr(row, "timeout_s", None),
        error_type=getattr(row, "error_type", None),
        progress=getattr(row, "progress", None),
        custom_id=getattr(row, "custom_id", None),
        retry_of=getattr(row, "retry_of", None),
        webhook_url=getattr(row, "webhook_url", None),
        webhook_events=getattr(row, "webhook_events", None),
        run_items=getattr(row, "run_items", None),
        run_cap=getattr(row, "run_cap", None),
    )


def summary_from_columns(
    *, id: str, kind: str, tier: str, status: str, created_at: datetime,
    enqueued_at: datetime, started_at: datetime | None,
) -> JobSummary:
    return JobSummary(id=id, kind=kind, tier=tier, status=Status(status),
                      created_at=epoch_required(created_at),
                      enqueued_at=epoch_required(enqueued_at), started_at=epoch_or_none(started_at))
