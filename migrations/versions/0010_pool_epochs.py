"""Pools: the index epoch of each pool but ``default``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

Each pool is an index of its own in Redis (``jobs.core.pools``), which can lose its data or
come back from a snapshot as the default pool's can; the reconciler keeps each pool's epoch
equal in SQL and in Redis. The default pool keeps its row in ``index_state``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pool_epochs",
        sa.Column("pool", sa.String(40), primary_key=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pool_epochs")
