"""The SQL of the job explorer: one page of jobs matching a ``JobQuery``, newest first.

A page is ordered by id (ids are time-ordered, ``jobs.core.ids``), and its cursor is the id
the previous page ended on, so a page is a range of whichever ``(..., id)`` index fits the
filters: ``(tenant_id, id)``, ``(tenant_id, status, id)``, ``(status, id)``, ``(kind, id)`` or
the primary key. A time window (``since``/``until``, on ``created_at``) is also turned into a
range of ids: a job's id carries the millisecond it was created at (the submit and the batch
write both from the same clock reading), so the window bounds the index scan instead of
filtering a walk down from the newest job, which would read every row newer than ``until``.
The ``created_at`` comparison stays, exact; the id range has a millisecond of slack each way.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobs.core.domain import Job
from jobs.core.errors import InvalidRequest
from jobs.core.states import Status
from jobs.store.models import JobRow
from jobs.store.rows import FRESH, TOMBSTONES, dt, job_from_row

# The UUIDv7 layout: 48 bits of milliseconds, then 80 bits (version, variant, random).
_RANDOM_BITS = 80
_MAX_MS = (1 << 48) - 1


@dataclass(frozen=True, kw_only=True)
class JobQuery:
    """Which jobs: each field left None matches every job; times are epoch seconds,
    ``since`` inclusive, ``until`` exclusive, of ``created_at``."""

    tenant_id: str | None = None
    status: Status | None = None
    kind: str | None = None
    tier: str | None = None
    since: float | None = None
    until: float | None = None


def search_jobs(
    session: Session, query: JobQuery, *, limit: int, cursor: str | None = None
) -> tuple[list[Job], str | None]:
    """One page of the jobs ``query`` matches, newest first, and the cursor of the next
    (None: this is the last)."""
    if limit < 1:
        raise InvalidRequest("limit must be at least 1", limit=limit)
    stmt = sa.select(JobRow)
    if query.tenant_id is not None:
        stmt = stmt.where(JobRow.tenant_id == query.tenant_id)
    if query.status is not None:
        stmt = stmt.where(JobRow.status == query.status.value)
    if query.kind is not None:
        stmt = stmt.where(JobRow.kind == query.kind)
    if query.tier is not None:
        stmt = stmt.where(JobRow.tier == query.tier)
    if query.since is not None:
        stmt = stmt.where(JobRow.created_at >= dt(query.since),
                          JobRow.id >= _id_at_ms(int(query.since * 1000) - 1))
    if query.until is not None:
        stmt = stmt.where(JobRow.created_at < dt(query.until),
                          JobRow.id < _id_at_ms(int(query.until * 1000) + 2))
    if cursor is not None:
        stmt = stmt.where(JobRow.id < decode_cursor(cursor))
    stmt = stmt.order_by(JobRow.id.desc()).limit(limit + 1)
    rows = session.scalars(stmt, execution_options=FRESH).all()
    page = [job_from_row(row) for row in rows[:limit]]
    next_cursor = encode_cursor(page[-1].id) if len(rows) > limit else None
    return page, next_cursor


def pruned_owner(session: Session, job_id: str) -> str | None:
    """The tenant whose job of this id was pruned after its retention period, or None."""
    stmt = sa.select(TOMBSTONES.c.tenant_id).where(TOMBSTONES.c.id == job_id)
    owner: str | None = session.execute(stmt.limit(1)).scalar()
    return owner


def _id_at_ms(ms: int) -> str:
    """The smallest id a job created at millisecond ``ms`` can have (ids compare as text
    in the same order as their numbers: fixed-width lower-case hex)."""
    ms = min(max(ms, 0), _MAX_MS)
    return str(uuid.UUID(int=ms << _RANDOM_BITS))


def encode_cursor(job_id: str) -> str:
    return base64.urlsafe_b64encode(job_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The job id the previous page ended on; anything else is an invalid request."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        job_id = str(uuid.UUID(text))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequest("invalid cursor", cursor=cursor) from None
    if job_id != text:
        raise InvalidRequest("invalid cursor", cursor=cursor)
    return job_id
