"""Whose start it is: ``jobs.start_token``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

A worker's start (dispatched → running) writes a token of its own, new for every message it
handles. A start whose COMMIT answer was lost is recognised on retry by that token, so a
second copy of the same broker message can never take another worker's start for its own
and run the attempt a second time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("start_token", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("start_token")
