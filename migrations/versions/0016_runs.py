"""Packing: a job's run.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

``run_items`` says how many items the run of a job's latest start held (the job body shows
it); ``run_cap`` bounds the runs of a job whose run failed as a whole, halved at each split
until the item that breaks it runs alone (``jobs.core.packing``). A slot's first item reads
the queued jobs of its kind in dispatch order to fill its run: a partial index, queued rows
only on PostgreSQL (whole on SQLite, as every index of the jobs table there).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUED = "status = 'queued'"


def upgrade() -> None:
    # Plain ALTER TABLE ... ADD COLUMN on both dialects: SQLite keeps the table (and the
    # webhook triggers of migration 0013 on it) as it is.
    op.add_column("jobs", sa.Column("run_items", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("run_cap", sa.Integer(), nullable=True))
    op.create_index("ix_jobs_kind_order_key", "jobs", ["kind", "order_key"],
                    postgresql_where=sa.text(QUEUED))


def downgrade() -> None:
    op.drop_index("ix_jobs_kind_order_key", table_name="jobs")
    # ALTER TABLE ... DROP COLUMN on both dialects (SQLite 3.35 on): a batch copy of the
    # table would drop its webhook triggers with it.
    op.drop_column("jobs", "run_cap")
    op.drop_column("jobs", "run_items")
