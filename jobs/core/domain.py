"""Domain values: tenants and jobs as frozen, keyword-only dataclasses.

Times are float epoch seconds (UTC). The database keeps timezone-aware UTC datetimes; the
conversion happens only in ``jobs.store`` (``jobs.store.rows``), which turns every row into
one of these values: ORM classes never leave it, and nothing here knows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.core.ids import new_job_id
from jobs.core.states import Status


@dataclass(frozen=True, kw_only=True)
class Tenant:
    """A client account. Its tier is fixed by this record, never by a request."""

    id: str
    name: str
    tier: str
    api_key_hash: str  # sha256 hex of the API key; the key itself is never stored
    created_at: float
    # Per-tenant overrides of the tier's policy (None: the tier's value).
    cap: int | None = None
    max_queued: int | None = None
    rate_per_s: float | None = None
    rate_burst: int | None = None


@dataclass(frozen=True, kw_only=True)
class NewJob:
    """What the API hands the store to insert: a job that is queued from the start."""

    tenant_id: str
    tier: str  # the tenant's tier at submission; it never changes afterwards
    kind: str
    payload: dict[str, Any]
    order_key: float
    enqueued_at: float
    max_attempts: int = 3
    max_wait_s: float | None = None
    idempotency_key: str | None = None
    created_at: float | None = None  # None: the same as enqueued_at
    blob: str | None = None  # the document the job reads (sha256 in the blob store)
    # The longest one attempt may run (the job's, else its kind's, else the policy's).
    timeout_s: float | None = None
    retry_of: str | None = None  # the job ``POST /v1/jobs/<id>/retry`` made this one from
    # Its webhook: the URL and the events as stored (``jobs.core.webhooks.events_column``).
    webhook_url: str | None = None
    webhook_events: str | None = None
    id: str = field(default_factory=new_job_id)

    @property
    def start_by(self) -> float | None:
        """The job must have started by then, or it expires (None: never)."""
        return None if self.max_wait_s is None else self.enqueued_at + self.max_wait_s


@dataclass(frozen=True, kw_only=True)
class Job:
    """A job as stored. ``(status, attempt)`` is what every state change compares.

    ``attempt`` numbers the job's trips through the dispatcher (each hand-back moves it on,
    so a stale message or lease of an earlier one changes nothing); ``starts`` counts the
    attempts that started (queued → running), and is what ``max_attempts`` limits: work
    handed back before it started is not charged."""

    id: str
    tenant_id: str
    tier: str
    kind: str
    payload: dict[str, Any]
    status: Status
    attempt: int
    max_attempts: int
    order_key: float
    created_at: float
    enqueued_at: float  # kept across retries, so a re-queued job keeps its ageing
    max_wait_s: float | None = None
    start_by: float | None = None  # enqueued_at + max_wait_s
    not_before: float | None = None  # retry backoff: not dispatched before this time
    dispatched_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    result: Any = None
    error: str | None = None
    idempotency_key: str | None = None
    cancel_requested: bool = False
    starts: int = 0
    updated_at: float | None = None
    result_fetched_at: float | None = None  # the first 200 of its result (None: never)
    # The batch this job is an item of, and its place there (None: a single job).
    batch_id: str | None = None
    batch_index: int | None = None
    # The document it reads, and the blob holding a result too large to keep inline.
    blob: str | None = None
    result_blob: str | None = None
    # The longest one attempt may run (None: a row from before limits, the policy's default).
    timeout_s: float | None = None
    # Why it ended badly, beside ``error`` (``jobs.core.error_types.ErrorType``).
    error_type: str | None = None
    # The handler's last progress report, stored with the ending (``jobs.core.progress``).
    progress: dict[str, Any] | None = None
    # A batch item's id of the client's own; the job a retry made this one from.
    custom_id: str | None = None
    retry_of: str | None = None
    # Its webhook (``jobs.core.webhooks``); a batch item carries its batch's.
    webhook_url: str | None = None
    webhook_events: str | None = None
    # How many items its latest start's run held (None: not started since packing, or
    # alone), and the bound a run that failed as a whole left it (``jobs.core.packing``).
    run_items: int | None = None
    run_cap: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status.terminal


@dataclass(frozen=True, kw_only=True)
class JobSummary:
    """A job's identity, state and times, without its payload or result (the dashboard's
    list of a tenant's latest jobs)."""

    id: str
    kind: str
    tier: str
    status: Status
    created_at: float
    enqueued_at: float
    started_at: float | None = None
