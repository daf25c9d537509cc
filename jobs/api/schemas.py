"""Request and response bodies of the HTTP API (API.md), as separate pydantic classes.

Requests are strict (``"3"`` is not a number, ``true`` is not an integer) and refuse unknown
fields, so a typo in a field name is an error rather than a silently ignored option.
Responses may grow new fields; existing ones are never renamed or removed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from jobs.states import Status
from jobs.submission import Progress
from jobs.tenants import NAME_PATTERN

MAX_WAIT_LIMIT_S = 30 * 24 * 3600.0


def rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(epoch, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# -- errors ----------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    """``type`` and ``message`` always; more fields by type (``details``, ``tier``, ...)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["capacity"])
    message: str = Field(examples=["tier 'free' is at its bound of 240 queued jobs"])
    details: list[dict[str, Any]] | None = Field(
        default=None, description="invalid_request: one entry per field, with loc and msg"
    )
    retry_after_seconds: int | None = Field(
        default=None, description="429 and 503: the same number as the Retry-After header"
    )
    tier: str | None = Field(default=None, description="429: the tenant's tier")
    queue_position: int | None = Field(
        default=None, description="429: jobs that would have been ahead of this one"
    )
    limit: str | None = Field(
        default=None, examples=["bound"],
        description="429: the limit hit: bound or deadline (capacity), quota or rate "
                    "(tenant_limit); its figures follow (bound, quota, rate_per_s, max_wait_s; "
                    "a deadline the tenant's own cap causes adds tenant_cap, tenant_inflight "
                    "and tenant_queued_ahead)",
    )
    job_error: str | None = Field(default=None, description="job_failed: the job's error")


class ErrorResponse(BaseModel):
    error: ErrorDetail


# -- jobs ------------------------------------------------------------------------------------

POSITION = "queued jobs ahead of this one in dispatch order, all tenants; null unless queued"
ESTIMATE = ("seconds until it is expected to start: the later of the pool's start and a slot "
            "under the tenant's own cap; null unless queued, or when it cannot be estimated")


class SubmitRequest(_Request):
    kind: Annotated[str, Field(min_length=1, max_length=100, examples=["sleep"])]
    payload: dict[str, Any] = Field(default_factory=dict, examples=[{"seconds": 2}])
    idempotency_key: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    max_wait_s: Annotated[float, Field(gt=0, le=MAX_WAIT_LIMIT_S)] | None = Field(
        default=None, description="not started by then: the job expires, never computed"
    )
    max_attempts: Annotated[int, Field(ge=1, le=100)] | None = None


class JobLinks(BaseModel):
    self_: str = Field(alias="self")
    result: str

    @classmethod
    def for_job(cls, job_id: str) -> JobLinks:
        return cls(self=f"/v1/jobs/{job_id}", result=f"/v1/jobs/{job_id}/result")


class SubmitResponse(BaseModel):
    id: str
    status: Status
    tier: str
    queue_position: int | None = Field(description=POSITION)
    estimated_wait_s: float | None = Field(description=ESTIMATE)
    links: JobLinks

    @classmethod
    def of(cls, progress: Progress) -> SubmitResponse:
        job = progress.job
        return cls(
            id=job.id,
            status=job.status,
            tier=job.tier,
            queue_position=progress.queue_position,
            estimated_wait_s=progress.estimated_wait_s,
            links=JobLinks.for_job(job.id),
        )


class JobResponse(BaseModel):
    id: str
    kind: str
    tier: str
    status: Status
    attempt: int
    max_attempts: int
    starts: int = Field(
        default=0, description="Attempts that started: what max_attempts limits (a job "
        "handed back before it started is not charged)."
    )
    queue_position: int | None = Field(description=POSITION)
    estimated_wait_s: float | None = Field(description=ESTIMATE)
    created_at: str | None
    enqueued_at: str | None
    dispatched_at: str | None
    started_at: str | None
    finished_at: str | None
    error: str | None
    max_wait_s: float | None
    cancel_requested: bool

    @classmethod
    def of(cls, progress: Progress) -> JobResponse:
        job = progress.job
        return cls(
            id=job.id,
            kind=job.kind,
            tier=job.tier,
            status=job.status,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            starts=job.starts,
            queue_position=progress.queue_position,
            estimated_wait_s=progress.estimated_wait_s,
            created_at=rfc3339(job.created_at),
            enqueued_at=rfc3339(job.enqueued_at),
            dispatched_at=rfc3339(job.dispatched_at),
            started_at=rfc3339(job.started_at),
            finished_at=rfc3339(job.finished_at),
            error=job.error,
            max_wait_s=job.max_wait_s,
            cancel_requested=job.cancel_requested,
        )


class JobListResponse(BaseModel):
    jobs: list[JobResponse]
    next_cursor: str | None


class ResultResponse(BaseModel):
    id: str
    status: Status
    result: Any = None


class PendingResultResponse(BaseModel):
    """202 from ``/result``: not finished yet; come back after ``Retry-After``."""

    id: str
    status: Status
    queue_position: int | None
    estimated_wait_s: float | None


class CancelResponse(BaseModel):
    id: str
    status: Status
    cancel_requested: bool


# -- queues and health -----------------------------------------------------------------------


class TierQueue(BaseModel):
    name: str
    queued: int
    bound: int
    oldest_age_s: float | None
    tenant_cap: int
    wait_p50_s: float | None
    wait_p95_s: float | None


class PoolView(BaseModel):
    capacity: int
    inflight: int
    utilisation: float
    service_rate: float


class QueuesResponse(BaseModel):
    tiers: list[TierQueue]
    pool: PoolView


class HealthResponse(BaseModel):
    status: str


class ReadyResponse(BaseModel):
    status: str
    checks: dict[str, str]


# -- tenants ---------------------------------------------------------------------------------


class TenantCreateRequest(_Request):
    name: Annotated[str, Field(pattern=NAME_PATTERN, examples=["acme"])]
    tier: Annotated[str, Field(min_length=1, max_length=64, examples=["premium"])]


class TenantPatchRequest(_Request):
    """Fields left out stay as they are; ``null`` clears an override (the tier's applies)."""

    tier: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    cap: Annotated[int, Field(ge=1, description="jobs running at once")] | None = None
    max_queued: Annotated[int, Field(ge=1, description="jobs queued at once")] | None = None
    rate_per_s: Annotated[float, Field(gt=0, le=1e6, description="submits per second")] | None = (
        None)
    rate_burst: Annotated[int, Field(ge=1, le=1_000_000, description="submits at once")] | None = (
        None)


class TenantResponse(BaseModel):
    id: str
    name: str
    tier: str
    created_at: str | None
    cap: int | None = Field(default=None, description="override of the tier's tenant cap")
    max_queued: int | None = Field(default=None, description="override of the tier's quota")
    rate_per_s: float | None = Field(default=None, description="override of the tier's rate")
    rate_burst: int | None = Field(default=None, description="override of the tier's burst")


class TenantWithKeyResponse(TenantResponse):
    api_key: str = Field(description="shown once; only its hash is stored")


class TenantListResponse(BaseModel):
    tenants: list[TenantResponse]
