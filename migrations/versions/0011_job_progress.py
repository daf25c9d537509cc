"""Progress: ``jobs.progress``, the last report of a job's handler, stored with its ending.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03

While a job runs its reports live in Redis (no SQL write per report); the last one is
written with the ending, so a finished job still shows how far it got.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column(
            "progress", sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True),
                                                                "postgresql"),
            nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("progress")
