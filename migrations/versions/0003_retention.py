"""Retention: the first fetch of a result, tombstones of pruned jobs, pruning totals.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

- ``jobs.result_fetched_at``: the first time the result was handed out; a succeeded job
  pruned without one was abandoned. Existing rows: NULL (not known to have been fetched).
- ``ix_jobs_tier_finished_at``: the pruner's walk, a tier's finished jobs oldest first.
- ``job_tombstones``: pruned jobs' ids and owners, so their owner gets ``410 job_gone``.
- ``retention_totals``: jobs pruned and abandoned per tier (the Prometheus counters).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("result_fetched_at", sa.DateTime(timezone=True),
                                   nullable=True))
    op.create_index(op.f("ix_jobs_tier_finished_at"), "jobs", ["tier", "finished_at"])
    op.create_table(
        "job_tombstones",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("tenant_id", sa.String(36), nullable=False),
        sa.Column("tier", sa.String(64), nullable=False),
        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_tombstones")),
    )
    op.create_index(op.f("ix_job_tombstones_tier_pruned_at"), "job_tombstones",
                    ["tier", "pruned_at"])
    op.create_table(
        "retention_totals",
        sa.Column("tier", sa.String(64), nullable=False),
        sa.Column("pruned", sa.BigInteger(), nullable=False),
        sa.Column("abandoned", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tier", name=op.f("pk_retention_totals")),
    )


def downgrade() -> None:
    op.drop_table("retention_totals")
    op.drop_index(op.f("ix_job_tombstones_tier_pruned_at"), table_name="job_tombstones")
    op.drop_table("job_tombstones")
    op.drop_index(op.f("ix_jobs_tier_finished_at"), table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("result_fetched_at")
