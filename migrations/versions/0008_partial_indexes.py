"""The jobs table's indexes hold only the rows their queries read (PostgreSQL).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

A state change writes a new row version, and PostgreSQL adds an entry for it to every index
of the table whose predicate it meets (a status change is never a HOT update: the status is
indexed). Made partial, an index that a row does not belong in costs that row nothing: the
dispatch-order and reconciler indexes hold the live rows, the metrics and retention indexes
the started or finished ones, the batch and blob indexes the rows that have one. A job's
submit, start and finish then write 17 index entries, not 36. SQLite keeps its indexes
whole (its planner uses a partial index only when the query repeats its predicate).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE_ROWS = "status IN ('waiting', 'queued', 'dispatched', 'running')"
# name -> (columns, predicate), as jobs.store.models declares them.
PARTIAL: dict[str, tuple[list[str], str]] = {
    "ix_jobs_status_order_key": (["status", "order_key"], LIVE_ROWS),
    "ix_jobs_status_updated_at": (["status", "updated_at"], LIVE_ROWS),
    "ix_jobs_finished_at": (["finished_at"], "finished_at IS NOT NULL"),
    "ix_jobs_tier_started_at": (["tier", "started_at"], "started_at IS NOT NULL"),
    "ix_jobs_tier_finished_at": (["tier", "finished_at"], "finished_at IS NOT NULL"),
    "ix_jobs_batch_id_batch_index": (["batch_id", "batch_index"], "batch_id IS NOT NULL"),
    "ix_jobs_status_batch_id_batch_index": (["status", "batch_id", "batch_index"],
                                            "status = 'waiting'"),
    "ix_jobs_blob": (["blob"], "blob IS NOT NULL"),
    "ix_jobs_result_blob": (["result_blob"], "result_blob IS NOT NULL"),
}


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if not _postgresql():
        return
    for name, (columns, predicate) in PARTIAL.items():
        op.drop_index(name, table_name="jobs")
        op.create_index(name, "jobs", columns, postgresql_where=sa.text(predicate))


def downgrade() -> None:
    if not _postgresql():
        return
    for name, (columns, _predicate) in PARTIAL.items():
        op.drop_index(name, table_name="jobs")
        op.create_index(name, "jobs", columns)
