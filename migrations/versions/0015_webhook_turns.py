"""Webhook events by tenant: the deliverer's read of what is due takes each tenant's turn.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07

The deliverer reads at most what each tenant may still start (``jobs.store.webhooks.due``):
the tenants with pending events, one index probe each, then a few of each due one's events.
Both walk pending events by ``(tenant_id, next_attempt_at)``; the index by
``(status, next_attempt_at)`` it replaces made one tenant's backlog the whole read. Partial
on both dialects, so delivered and given-up events, kept until their jobs are pruned, are not
in it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PENDING = "status = 'pending'"


def upgrade() -> None:
    op.create_index("ix_webhook_events_tenant_id_next_attempt_at", "webhook_events",
                    ["tenant_id", "next_attempt_at"], postgresql_where=sa.text(PENDING),
                    sqlite_where=sa.text(PENDING))
    op.drop_index("ix_webhook_events_status_next_attempt_at", table_name="webhook_events")


def downgrade() -> None:
    op.create_index("ix_webhook_events_status_next_attempt_at", "webhook_events",
                    ["status", "next_attempt_at"], postgresql_where=sa.text(PENDING))
    op.drop_index("ix_webhook_events_tenant_id_next_attempt_at", table_name="webhook_events")
