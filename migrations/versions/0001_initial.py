"""Initial schema: tenants and jobs.

Revision ID: 0001
Revises:
Create Date: 2024-06-01

Written by hand to match ``jobs.store.models`` exactly (a test runs autogenerate against it and
expects no difference, and compares the CHECK constraints, which autogenerate ignores).
Status values are copied, not imported: a migration is a snapshot. Names are wrapped in
``op.f`` (final), so the metadata's naming convention is not applied to them a second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("queued", "dispatched", "running", "succeeded", "failed", "cancelled", "expired")


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _time() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("tier", sa.String(64), nullable=False),
        sa.Column("api_key_hash", sa.String(64), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("cap", sa.Integer(), nullable=True),
        sa.Column("max_queued", sa.Integer(), nullable=True),
        sa.Column("rate_per_s", sa.Double(), nullable=True),
        sa.Column("rate_burst", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
        sa.UniqueConstraint("api_key_hash", name=op.f("uq_tenants_api_key_hash")),
    )
    _create_jobs()
    op.create_index(op.f("ix_jobs_tenant_id_id"), "jobs", ["tenant_id", "id"])
    op.create_index(op.f("ix_jobs_tenant_id_status_id"), "jobs", ["tenant_id", "status", "id"])
    op.create_index(op.f("ix_jobs_status_order_key"), "jobs", ["status", "order_key"])
    op.create_index(op.f("ix_jobs_finished_at"), "jobs", ["finished_at"])
    op.create_index(op.f("ix_jobs_tier_started_at"), "jobs", ["tier", "started_at"])


def _create_jobs() -> None:
    status_check = "status IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")"
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("tenant_id", sa.String(36), nullable=False),
        sa.Column("tier", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(100), nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("order_key", sa.Double(), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("enqueued_at", _time(), nullable=False),
        sa.Column("max_wait_s", sa.Double(), nullable=True),
        sa.Column("start_by", _time(), nullable=True),
        sa.Column("not_before", _time(), nullable=True),
        sa.Column("dispatched_at", _time(), nullable=True),
        sa.Column("started_at", _time(), nullable=True),
        sa.Column("finished_at", _time(), nullable=True),
        sa.Column("result", _json(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_jobs_tenant_id_tenants")
        ),
        sa.CheckConstraint(status_check, name=op.f("ck_jobs_status")),
        sa.CheckConstraint("attempt >= 1", name=op.f("ck_jobs_attempt_positive")),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_jobs_max_attempts_positive")),
        sa.UniqueConstraint(
            "tenant_id", "idempotency_key", name=op.f("uq_jobs_tenant_id_idempotency_key")
        ),
    )


def downgrade() -> None:
    for index in (
        "ix_jobs_tier_started_at",
        "ix_jobs_finished_at",
        "ix_jobs_status_order_key",
        "ix_jobs_tenant_id_status_id",
        "ix_jobs_tenant_id_id",
    ):
        op.drop_index(op.f(index), table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("tenants")
