"""The job explorer's indexes: every tenant's jobs newest first, by ended status or by kind.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03

``GET /v1/admin/jobs?status=failed`` or ``?kind=...`` pages through all tenants' jobs by id;
without these a rare status or kind walks the primary key down through every newer job (a
kind no job has, the whole table). On PostgreSQL the status index holds only ended rows,
which a job enters once, when it ends: the live states are few and already indexed. A
tenant's own searches keep using ``(tenant_id, id)`` and ``(tenant_id, status, id)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENDED_ROWS = "status IN ('succeeded', 'failed', 'cancelled', 'expired')"


def upgrade() -> None:
    op.create_index("ix_jobs_status_id", "jobs", ["status", "id"],
                    postgresql_where=sa.text(ENDED_ROWS))
    op.create_index("ix_jobs_kind_id", "jobs", ["kind", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_kind_id", table_name="jobs")
    op.drop_index("ix_jobs_status_id", table_name="jobs")
