"""Webhooks: subscriptions on jobs and batches, the tenants' signing secrets, the outbox of
events (``webhook_events``) with each delivery try (``webhook_attempts``), and the trigger
that records an event in the transaction of the change it reports.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

A job's status changes on many paths (a worker's start and its ending in one statement, a
cancel, the reaper, expiry, a batch's cancel or window): a trigger on ``jobs.status`` sees
every one of them, in its transaction, and costs a job without a subscription nothing but
its ``WHEN``. It records ``job.started`` and ``job.completed`` for a job's own subscription,
``batch.item.completed`` for a batch item whose batch asked for it, and ``batch.completed``
when the last open item of such a batch ends (``batches.open_items``, counted down under
the batch row's lock). A later migration that rebuilds ``jobs`` on SQLite (a batch
``drop_column``) drops the triggers with the table and must create them again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "('succeeded', 'failed', 'cancelled', 'expired')"
COLUMNS = "id, tenant_id, job_id, batch_id, type, url, created_at, next_attempt_at"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("webhook_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("webhook_events", sa.String(64), nullable=True))
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("webhook_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("webhook_events", sa.String(64), nullable=True))
        batch.add_column(sa.Column("open_items", sa.Integer(), nullable=True))
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("webhook_secret", sa.String(80), nullable=True))
        batch.add_column(sa.Column("webhook_secret_previous", sa.String(80), nullable=True))
        batch.add_column(sa.Column("webhook_previous_until", sa.DateTime(timezone=True),
                                   nullable=True))
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(36), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=True),
        sa.Column("batch_id", sa.String(36), nullable=True),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("status", sa.String(16), server_default="pending", nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_events")),
        sa.CheckConstraint("status IN ('pending', 'delivered', 'failed')",
                           name=op.f("ck_webhook_events_status")),
    )
    op.create_index("ix_webhook_events_status_next_attempt_at", "webhook_events",
                    ["status", "next_attempt_at"],
                    postgresql_where=sa.text("status = 'pending'"))
    op.create_index("ix_webhook_events_job_id", "webhook_events", ["job_id"])
    op.create_index("ix_webhook_events_batch_id", "webhook_events", ["batch_id"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(40), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_attempts")),
    )
    op.create_index("ix_webhook_attempts_event_id", "webhook_attempts", ["event_id"])
    if op.get_bind().dialect.name == "postgresql":
        _postgresql_trigger()
    else:
        _sqlite_triggers()


def _postgresql_trigger() -> None:
    def insert(kind: str, url: str = "NEW.webhook_url", job: str = "NEW.id") -> str:
        return (f"INSERT INTO webhook_events ({COLUMNS}) VALUES ('msg_' || "
                f"replace(gen_random_uuid()::text, '-', ''), NEW.tenant_id, {job}, "
                f"NEW.batch_id, '{kind}', {url}, NEW.updated_at, NEW.updated_at);")

    op.execute(f"""
CREATE FUNCTION tierq_webhook_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    left_open integer;
    batch_url text;
BEGIN
    IF NEW.status = 'running' AND NEW.webhook_events LIKE '%,started,%' THEN
        {insert("job.started")}
    ELSIF NEW.status IN {TERMINAL} THEN
        IF NEW.webhook_events LIKE '%,completed,%' THEN
            {insert("job.completed")}
        END IF;
        IF NEW.webhook_events LIKE '%,item.completed,%' THEN
            {insert("batch.item.completed")}
        END IF;
        IF NEW.batch_id IS NOT NULL AND NEW.webhook_events LIKE '%,batch.completed,%' THEN
            UPDATE batches SET open_items = open_items - 1 WHERE id = NEW.batch_id
                RETURNING open_items, webhook_url INTO left_open, batch_url;
            IF left_open = 0 THEN
                {insert("batch.completed", url="batch_url", job="NULL")}
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END $$;
""")
    op.execute("""
CREATE TRIGGER jobs_webhook_events AFTER UPDATE OF status ON jobs FOR EACH ROW
WHEN (NEW.webhook_url IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status)
EXECUTE FUNCTION tierq_webhook_events();
""")


# SQLite: a trigger per event, each with its own WHEN.
_SQLITE_ID = "'msg_' || lower(hex(randomblob(16)))"
_SQLITE_WHEN = "NEW.webhook_url IS NOT NULL AND NEW.status IS NOT OLD.status"


def _sqlite_insert(kind: str) -> str:
    return (f"INSERT INTO webhook_events ({COLUMNS}) VALUES ({_SQLITE_ID}, NEW.tenant_id, "
            f"NEW.id, NEW.batch_id, '{kind}', NEW.webhook_url, NEW.updated_at, "
            "NEW.updated_at);")


def _sqlite_triggers() -> None:
    for name, condition, body in (
        ("started", "NEW.status = 'running' AND NEW.webhook_events LIKE '%,started,%'",
         _sqlite_insert("job.started")),
        ("completed", f"NEW.status IN {TERMINAL} AND NEW.webhook_events LIKE '%,completed,%'",
         _sqlite_insert("job.completed")),
        ("item_completed",
         f"NEW.status IN {TERMINAL} AND NEW.webhook_events LIKE '%,item.completed,%'",
         _sqlite_insert("batch.item.completed")),
        ("batch_completed",
         f"NEW.status IN {TERMINAL} AND NEW.batch_id IS NOT NULL "
         "AND NEW.webhook_events LIKE '%,batch.completed,%'",
         "UPDATE batches SET open_items = open_items - 1 WHERE id = NEW.batch_id; "
         f"INSERT INTO webhook_events ({COLUMNS}) SELECT {_SQLITE_ID}, NEW.tenant_id, NULL, "
         "NEW.batch_id, 'batch.completed', b.webhook_url, NEW.updated_at, NEW.updated_at "
         "FROM batches AS b WHERE b.id = NEW.batch_id AND b.open_items = 0;"),
    ):
        op.execute(f"CREATE TRIGGER jobs_webhook_{name} AFTER UPDATE OF status ON jobs "
                   f"FOR EACH ROW WHEN {_SQLITE_WHEN} AND {condition} BEGIN {body} END")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER jobs_webhook_events ON jobs")
        op.execute("DROP FUNCTION tierq_webhook_events()")
    else:
        for name in ("started", "completed", "item_completed", "batch_completed"):
            op.execute(f"DROP TRIGGER jobs_webhook_{name}")
    op.drop_index("ix_webhook_attempts_event_id", table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_events_batch_id", table_name="webhook_events")
    op.drop_index("ix_webhook_events_job_id", table_name="webhook_events")
    op.drop_index("ix_webhook_events_status_next_attempt_at", table_name="webhook_events")
    op.drop_table("webhook_events")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("webhook_previous_until")
        batch.drop_column("webhook_secret_previous")
        batch.drop_column("webhook_secret")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("open_items")
        batch.drop_column("webhook_events")
        batch.drop_column("webhook_url")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("webhook_events")
        batch.drop_column("webhook_url")
