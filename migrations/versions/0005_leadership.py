"""The leader's claim in SQL: one row naming the fencing token of the dispatcher that leads.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

A leader writes its token here before it reads SQL to restore leases, and the transactions
that decide a job from a lease it reaped (the reaper, the reconciler's orphans) first check
that the row still names it. A deposed leader's decision, taken on a lease its successor has
restored since, is refused instead of re-queueing a job whose worker is running it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "leadership",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leadership")),
    )
    op.bulk_insert(table, [{"id": 1, "holder": ""}])


def downgrade() -> None:
    op.drop_table("leadership")
