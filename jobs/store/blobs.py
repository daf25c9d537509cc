"""The SQL of blob records: a blob is recorded before its bytes are written, and only
unreferenced records past their grace are taken for pruning (``jobs.blobs.records``)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from jobs.store.models import (
    BlobRow,
)
from jobs.store.rows import (
    JOBS,
    dt,
)


def record_blob(session: Session, sha256: str, *, size: int, now: float) -> None:
    """Record a blob about to be written (again): its grace starts over. Waits for a pruner
    holding the row, so a blob is never deleted under a writer that recorded it."""
    values = {"sha256": sha256, "bytes": size, "stored_at": dt(now)}
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
        .where(BlobRow.stored_at < dt(before), ~named)
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
