"""Run-time limits: ``jobs.timeout_s``, ``jobs.error_type`` and ``batches.timeout_s``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

Each job carries the longest one attempt may run, resolved at submit (the job's own, else
its kind's, else ``policy.default_timeout_s``); rows from before stay NULL and get the
policy's default when they run. ``error_type`` classifies why a job ended badly beside the
``error`` sentence. A batch keeps the limit its items are given.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("timeout_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("error_type", sa.String(32), nullable=True))
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("timeout_s", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("timeout_s")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("error_type")
        batch.drop_column("timeout_s")
