"""Blobs in SQL: what the blob store holds, and which jobs reference it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

- ``blobs`` has a row per stored blob (sha256, size, when it was last stored): written before
  the bytes, so the pruner knows every blob, including one whose job never committed.
- ``jobs.blob`` names the document a job reads, ``jobs.result_blob`` the blob holding a
  result too large to keep inline. A blob no job names, stored longer ago than a grace, is
  pruned (``jobs.blobs.records``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("stored_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_blobs")),
    )
    op.create_index(op.f("ix_blobs_stored_at"), "blobs", ["stored_at"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("blob", sa.String(64), nullable=True))
        batch.add_column(sa.Column("result_blob", sa.String(64), nullable=True))
    op.create_index(op.f("ix_jobs_blob"), "jobs", ["blob"])
    op.create_index(op.f("ix_jobs_result_blob"), "jobs", ["result_blob"])


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_result_blob"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_blob"), table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("result_blob")
        batch.drop_column("blob")
    op.drop_index(op.f("ix_blobs_stored_at"), table_name="blobs")
    op.drop_table("blobs")
