"""The SQL schema: tenants, jobs and batches (SQLAlchemy 2.0 typed declarative).

Portable between SQLite (the embedded default) and PostgreSQL:

- times are ``UTCDateTime``: timezone-aware UTC datetimes going in and coming out, on both;
- JSON is ``JSONB`` on PostgreSQL and ``JSON`` elsewhere;
- ``status`` is a plain string with a CHECK listing the states, so a new state needs a new
  CHECK, not a database enum type migration.

``migrations/versions`` must create exactly this schema; a test compares the two.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobs.core.states import Status

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQL NULL (not the JSON text 'null') for Python None, so "no result" reads as NULL.
JSON_TYPE = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")

STATUS_VALUES = tuple(status.value for status in Status)

# On PostgreSQL the indexes of the jobs table hold only the rows their queries read (the live
# ones, the finished ones, a batch's): every state change writes a new row version into each
# index whose predicate it meets, so an index a row does not belong in costs it nothing. A
# submit, a start and a finish write 17 index entries instead of 36. (SQLite keeps them whole:
# its planner uses a partial index only when a query repeats its predicate word for word.)
LIVE_ROWS = sa.text("status IN ('waiting', 'queued', 'dispatched', 'running')")
ENDED_ROWS = sa.text("status IN ('succeeded', 'failed', 'cancelled', 'expired')")


def status_check_sql(values: tuple[str, ...] = STATUS_VALUES) -> str:
    """The CHECK expression on ``jobs.status``; the migration writes out its own copy."""
    return "status IN (" + ", ".join(f"'{value}'" for value in values) + ")"


class UTCDateTime(sa.TypeDecorator[datetime]):
    """Aware UTC datetimes in and out; SQLite (which keeps no zone) included.

    Naive datetimes are refused on the way in: a time without a zone is a bug upstream.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware UTC time")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class TenantRow(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    tier: Mapped[str] = mapped_column(sa.String(64))
    api_key_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Per-tenant overrides of the tier's policy; NULL means "the tier's value".
    cap: Mapped[int | None] = mapped_column(sa.Integer())
    max_queued: Mapped[int | None] = mapped_column(sa.Integer())
    rate_per_s: Mapped[float | None] = mapped_column(sa.Double())
    rate_burst: Mapped[int | None] = mapped_column(sa.Integer())
    # The secret that signs its webhooks (made on first use), and the one it replaced,
    # which still signs beside it until ``webhook_previous_until``.
    webhook_secret: Mapped[str | None] = mapped_column(sa.String(80))
    webhook_secret_previous: Mapped[str | None] = mapped_column(sa.String(80))
    webhook_previous_until: Mapped[datetime | None] = mapped_column(UTCDateTime())


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.CheckConstraint(status_check_sql(), name="status"),
        sa.CheckConstraint("attempt >= 1", name="attempt_positive"),
        sa.CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
        sa.UniqueConstraint("tenant_id", "idempotency_key"),
        # A tenant's jobs, newest first (ids are time-ordered), with or without a status.
        sa.Index("ix_jobs_tenant_id_id", "tenant_id", "id"),
        sa.Index("ix_jobs_tenant_id_status_id", "tenant_id", "status", "id"),
        # Rebuilding the dispatch index: queued and in-flight jobs in dispatch order.
        sa.Index("ix_jobs_status_order_key", "status", "order_key",
                 postgresql_where=LIVE_ROWS),
        # The reconciler: queued and in-flight jobs by their last change.
        sa.Index("ix_jobs_status_updated_at", "status", "updated_at",
                 postgresql_where=LIVE_ROWS),
        # Metrics: recent service times and recent waits per tier.
        sa.Index("ix_jobs_finished_at", "finished_at",
                 postgresql_where=sa.text("finished_at IS NOT NULL")),
        sa.Index("ix_jobs_tier_started_at", "tier", "started_at",
                 postgresql_where=sa.text("started_at IS NOT NULL")),
        # Retention: a tier's finished jobs, oldest first (only terminal rows have one).
        sa.Index("ix_jobs_tier_finished_at", "tier", "finished_at",
                 postgresql_where=sa.text("finished_at IS NOT NULL")),
        # Batches: a batch's items in order (counts, results), and the feeder's walk of the
        # waiting items of each batch.
        sa.Index("ix_jobs_batch_id_batch_index", "batch_id", "batch_index",
                 postgresql_where=sa.text("batch_id IS NOT NULL")),
        sa.Index("ix_jobs_status_batch_id_batch_index", "status", "batch_id", "batch_index",
                 postgresql_where=sa.text("status = 'waiting'")),
        # The job explorer (``jobs.store.search``), every tenant's jobs newest first: of one
        # ended status (live ones are few and have the indexes above), or of one kind.
        sa.Index("ix_jobs_status_id", "status", "id", postgresql_where=ENDED_ROWS),
        sa.Index("ix_jobs_kind_id", "kind", "id"),
        # Packing: a kind's queued jobs in dispatch order, the candidates of a run.
        sa.Index("ix_jobs_kind_order_key", "kind", "order_key",
                 postgresql_where=sa.text("status = 'queued'")),
        # Blob pruning: is a blob still named by a job?
        sa.Index("ix_jobs_blob", "blob", postgresql_where=sa.text("blob IS NOT NULL")),
        sa.Index("ix_jobs_result_blob", "result_blob",
                 postgresql_where=sa.text("result_blob IS NOT NULL")),
    )

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(36), sa.ForeignKey("tenants.id"))
    tier: Mapped[str] = mapped_column(sa.String(64))
    kind: Mapped[str] = mapped_column(sa.String(100))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON_TYPE)
    status: Mapped[str] = mapped_column(sa.String(16))
    attempt: Mapped[int] = mapped_column(sa.Integer())
    max_attempts: Mapped[int] = mapped_column(sa.Integer())
    order_key: Mapped[float] = mapped_column(sa.Double())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    enqueued_at: Mapped[datetime] = mapped_column(UTCDateTime())
    max_wait_s: Mapped[float | None] = mapped_column(sa.Double())
    start_by: Mapped[datetime | None] = mapped_column(UTCDateTime())
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime())
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    result: Mapped[Any | None] = mapped_column(JSON_TYPE)
    error: Mapped[str | None] = mapped_column(sa.Text())
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(255))
    cancel_requested: Mapped[bool] = mapped_column(sa.Boolean())
    # Attempts that started (queued -> running): what max_attempts limits.
    starts: Mapped[int] = mapped_column(sa.Integer(), server_default="0")
    # The last change of the row (insert or transition), on the one clock (Redis's).
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The first time the result was handed out (200 on /result): a succeeded job pruned
    # while this is NULL was abandoned, its work paid for and never collected.
    result_fetched_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The batch this job is an item of (None: a single job), and its place in the batch.
    batch_id: Mapped[str | None] = mapped_column(sa.String(36), sa.ForeignKey("batches.id"))
    batch_index: Mapped[int | None] = mapped_column(sa.Integer())
    # The document the job reads, and the blob holding a result too large to keep inline
    # (sha256 digests in the blob store): a blob no job names is pruned.
    blob: Mapped[str | None] = mapped_column(sa.String(64))
    result_blob: Mapped[str | None] = mapped_column(sa.String(64))
    # Who made the current start: a token new for every message a worker handles, so a
    # retried start recognises its own and never a copy's (``jobs.store.jobs.start``).
    start_token: Mapped[str | None] = mapped_column(sa.String(32))
    # The longest one attempt may run, seconds (NULL: a row from before run-time limits,
    # which gets the policy's default), and why the job ended badly beside ``error``
    # (``jobs.core.error_types.ErrorType``).
    timeout_s: Mapped[float | None] = mapped_column(sa.Double())
    error_type: Mapped[str | None] = mapped_column(sa.String(32))
    # The handler's last progress report (``jobs.core.progress``), written with the ending;
    # while the job runs, its reports live in Redis.
    progress: Mapped[Any | None] = mapped_column(JSON_TYPE)
    # A batch item's id of the client's own (unique within its batch), and the job that a
    # ``POST /v1/jobs/<id>/retry`` made this one from.
    custom_id: Mapped[str | None] = mapped_column(sa.String(200))
    retry_of: Mapped[str | None] = mapped_column(sa.String(36))
    # Its webhook (``jobs.core.webhooks``): a trigger records each event it names in the
    # transaction of the change (migration 0013). A batch item carries its batch's.
    webhook_url: Mapped[str | None] = mapped_column(sa.Text())
    webhook_events: Mapped[str | None] = mapped_column(sa.String(64))
    # Packing (``jobs.core.packing``, migration 0016): how many items the run of its latest
    # start held, and the bound on its runs that a run failing as a whole left it.
    run_items: Mapped[int | None] = mapped_column(sa.Integer())
    run_cap: Mapped[int | None] = mapped_column(sa.Integer())


class BlobRow(Base):
    """A blob in the blob store, recorded before its bytes are written: the pruner finds
    every blob, including one whose job never committed."""

    __tablename__ = "blobs"
    __table_args__ = (sa.Index("ix_blobs_stored_at", "stored_at"),)

    sha256: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    bytes: Mapped[int] = mapped_column(sa.BigInteger())
    # The last time these bytes were stored: a blob is kept a grace period after it.
    stored_at: Mapped[datetime] = mapped_column(UTCDateTime())


class BatchRow(Base):
    """A batch: its items are ``jobs`` rows (``batch_id``), stored ``waiting`` and fed into
    the tier's live queue as room allows (``jobs.dispatch.feeder``)."""

    __tablename__ = "batches"
    __table_args__ = (
        sa.CheckConstraint("total >= 1", name="total_positive"),
        sa.UniqueConstraint("tenant_id", "idempotency_key"),
        sa.Index("ix_batches_tenant_id_id", "tenant_id", "id"),
    )

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(36), sa.ForeignKey("tenants.id"))
    tier: Mapped[str] = mapped_column(sa.String(64))
    kind: Mapped[str] = mapped_column(sa.String(100))
    total: Mapped[int] = mapped_column(sa.Integer())
    max_attempts: Mapped[int] = mapped_column(sa.Integer())
    # Each item's run-time limit (NULL: its kind's or the policy's, as for a single job).
    timeout_s: Mapped[float | None] = mapped_column(sa.Double())
    # Items not started this long after the batch was stored end expired (their start_by).
    completion_window_s: Mapped[float | None] = mapped_column(sa.Double())
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(255))
    # sha256 of the kind and the validated items: what an idempotent resubmit is compared by.
    content_hash: Mapped[str] = mapped_column(sa.String(64))
    cancelled: Mapped[bool] = mapped_column(sa.Boolean())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Its webhook, and (with one that wants batch.completed) its items not ended yet,
    # counted down by the trigger that records the event when it reaches 0.
    webhook_url: Mapped[str | None] = mapped_column(sa.Text())
    webhook_events: Mapped[str | None] = mapped_column(sa.String(64))
    open_items: Mapped[int | None] = mapped_column(sa.Integer())


class IndexStateRow(Base):
    """One row: the epoch the reconciler keeps equal in SQL and in the Redis index. An index
    whose epoch differs lost its data or came back from an older snapshot."""

    __tablename__ = "index_state"

    id: Mapped[int] = mapped_column(sa.Integer(), primary_key=True)
    epoch: Mapped[int] = mapped_column(sa.BigInteger())


class PoolEpochRow(Base):
    """The epoch of each pool but ``default`` (whose epoch is ``IndexStateRow``'s): each
    pool's index can lose its data or come back from a snapshot on its own."""

    __tablename__ = "pool_epochs"

    pool: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    epoch: Mapped[int] = mapped_column(sa.BigInteger())


class LeadershipRow(Base):
    """One row: the fencing token of the leader that last claimed SQL. The reaper's and the
    reconciler's decisions commit only while it still names their token."""

    __tablename__ = "leadership"

    id: Mapped[int] = mapped_column(sa.Integer(), primary_key=True)
    holder: Mapped[str] = mapped_column(sa.String(255))


class JobTombstoneRow(Base):
    """A pruned job, kept one more retention period so that its owner is told ``410
    job_gone`` rather than ``404``; only the id, the owner and the time are kept."""

    __tablename__ = "job_tombstones"
    __table_args__ = (
        # Tombstones of a tier, oldest first: pruned in turn.
        sa.Index("ix_job_tombstones_tier_pruned_at", "tier", "pruned_at"),
    )

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(36))
    tier: Mapped[str] = mapped_column(sa.String(64))
    pruned_at: Mapped[datetime] = mapped_column(UTCDateTime())


class RetentionTotalRow(Base):
    """Jobs pruned and abandoned per tier since the start: counters kept in SQL, moved in
    the same transaction as the prune, so no crash can lose or double a count."""

    __tablename__ = "retention_totals"

    tier: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    pruned: Mapped[int] = mapped_column(sa.BigInteger())
    abandoned: Mapped[int] = mapped_column(sa.BigInteger())


class WebhookEventRow(Base):
    """An event to deliver (the outbox): recorded by the trigger of migration 0013 in the
    transaction of its change, delivered at least once (``jobs.service.deliverer``)."""

    __tablename__ = "webhook_events"
    __table_args__ = (
        sa.CheckConstraint("status IN ('pending', 'delivered', 'failed')", name="status"),
        # The deliverer's read of what is due: each tenant's pending events, due first.
        sa.Index("ix_webhook_events_tenant_id_next_attempt_at", "tenant_id", "next_attempt_at",
                 postgresql_where=sa.text("status = 'pending'"),
                 sqlite_where=sa.text("status = 'pending'")),
        sa.Index("ix_webhook_events_job_id", "job_id"),
        sa.Index("ix_webhook_events_batch_id", "batch_id"),
    )

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)  # the webhook-id
    tenant_id: Mapped[str] = mapped_column(sa.String(36))
    job_id: Mapped[str | None] = mapped_column(sa.String(36))
    batch_id: Mapped[str | None] = mapped_column(sa.String(36))
    type: Mapped[str] = mapped_column(sa.String(40))
    url: Mapped[str] = mapped_column(sa.Text())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # When it is due: its next try, or, while a deliverer holds it, when that claim lapses.
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    tries: Mapped[int] = mapped_column(sa.Integer(), server_default="0")
    status: Mapped[str] = mapped_column(sa.String(16), server_default="pending")
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebhookAttemptRow(Base):
    """One try of a delivery: its answer's status code, or why there was none."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (sa.Index("ix_webhook_attempts_event_id", "event_id"),)

    id: Mapped[int] = mapped_column(sa.Integer(), primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(sa.String(40))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    status_code: Mapped[int | None] = mapped_column(sa.Integer())
    error: Mapped[str | None] = mapped_column(sa.Text())
    duration_ms: Mapped[float] = mapped_column(sa.Double())
