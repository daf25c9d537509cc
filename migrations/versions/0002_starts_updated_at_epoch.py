"""Attempts that started, the time of each row's last change, and the index epoch.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

- ``jobs.starts`` counts dispatched -> running moves: ``max_attempts`` limits starts, so work
  handed back before it started is not charged. Existing rows: 1 when they ever started.
- ``jobs.updated_at`` is the time of the row's last change; the reconciler walks queued and
  in-flight rows by it (``ix_jobs_status_updated_at``). Existing rows: their latest known time.
- ``index_state`` holds the epoch the reconciler keeps equal in SQL and Redis.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("starts", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE jobs SET starts = CASE WHEN started_at IS NULL THEN 0 ELSE 1 END, "
        "updated_at = COALESCE(finished_at, started_at, dispatched_at, enqueued_at)"
    )
    op.create_index(op.f("ix_jobs_status_updated_at"), "jobs", ["status", "updated_at"])
    op.create_table(
        "index_state",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_index_state")),
    )


def downgrade() -> None:
    op.drop_table("index_state")
    op.drop_index(op.f("ix_jobs_status_updated_at"), table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("updated_at")
        batch.drop_column("starts")
