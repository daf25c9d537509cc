"""Batches: the ``batches`` table, a batch's items as ``jobs`` rows, and the ``waiting`` state.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

- ``batches`` holds one row per batch (kind, total, idempotency key and content hash).
- ``jobs.batch_id`` / ``jobs.batch_index`` tie an item to its batch; two indexes serve a
  batch's items in order and the feeder's walk of waiting items.
- ``jobs.status`` may be ``waiting``: stored, not yet admitted to the tier's live queue.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_STATUSES = ("queued", "dispatched", "running", "succeeded", "failed", "cancelled", "expired")
NEW_STATUSES = ("waiting", *OLD_STATUSES)


def _check(values: Sequence[str]) -> str:
    return "status IN (" + ", ".join(f"'{value}'" for value in values) + ")"


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("tenant_id", sa.String(36), nullable=False),
        sa.Column("tier", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(100), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("cancelled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("total >= 1", name=op.f("ck_batches_total_positive")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"],
                                name=op.f("fk_batches_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
        sa.UniqueConstraint("tenant_id", "idempotency_key",
                            name=op.f("uq_batches_tenant_id_idempotency_key")),
    )
    op.create_index(op.f("ix_batches_tenant_id_id"), "batches", ["tenant_id", "id"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("batch_id", sa.String(36), nullable=True))
        batch.add_column(sa.Column("batch_index", sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f("fk_jobs_batch_id_batches"), "batches",
                                 ["batch_id"], ["id"])
        batch.drop_constraint(op.f("ck_jobs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_jobs_status"), _check(NEW_STATUSES))
    op.create_index(op.f("ix_jobs_batch_id_batch_index"), "jobs", ["batch_id", "batch_index"])
    op.create_index(op.f("ix_jobs_status_batch_id_batch_index"), "jobs",
                    ["status", "batch_id", "batch_index"])


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_status_batch_id_batch_index"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_batch_id_batch_index"), table_name="jobs")
    op.execute("DELETE FROM jobs WHERE batch_id IS NOT NULL")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(op.f("ck_jobs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_jobs_status"), _check(OLD_STATUSES))
        batch.drop_constraint(op.f("fk_jobs_batch_id_batches"), type_="foreignkey")
        batch.drop_column("batch_index")
        batch.drop_column("batch_id")
    op.drop_index(op.f("ix_batches_tenant_id_id"), table_name="batches")
    op.drop_table("batches")
