"""Batch envelopes and retries: ``jobs.custom_id``, ``jobs.retry_of``,
``batches.completion_window_s``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03

A batch item may carry the client's own id (``custom_id``, unique within its batch), handed
back on its result line; a batch may give its items a window to start in
(``completion_window_s``: each item's ``start_by``); a job submitted by
``POST /v1/jobs/<id>/retry`` names the job it retries.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("custom_id", sa.String(200), nullable=True))
        batch.add_column(sa.Column("retry_of", sa.String(36), nullable=True))
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("completion_window_s", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("completion_window_s")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("retry_of")
        batch.drop_column("custom_id")
