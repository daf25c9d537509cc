"""Request and response bodies of the HTTP API (API.md), as separate pydantic classes.

Requests are strict (``"3"`` is not a number, ``true`` is not an integer) and refuse unknown
fields, so a typo in a field name is an error rather than a silently ignored option. Every
number is bounded and finite, so no value can overflow a column or a computation behind the
API. Responses may grow new fields; existing ones are never renamed or removed. Every field
carries a description: the OpenAPI document is the reference a client reads.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from jobs.admission.estimates import Progress
from jobs.api.webhook_schemas import WebhookRequest
from jobs.core.error_types import ErrorType
from jobs.core.policy import (
    MAX_TENANT_BURST,
    MAX_TENANT_CAP,
    MAX_TENANT_QUEUED,
    MAX_TENANT_RATE_PER_S,
    MAX_TIMEOUT_S,
)
from jobs.core.progress import Report
from jobs.core.states import Status
from jobs.core.webhooks import events_of
from jobs.service.tenants import NAME_PATTERN

MAX_WAIT_LIMIT_S = 30 * 24 * 3600.0
MAX_ATTEMPTS_LIMIT = 100
TIMEOUT = ("seconds one attempt may run, at most a day; at the limit its handler is asked to "
           "stop, and the process running it is ended policy.timeout_grace_s later; the "
           "attempt ends timed_out (default: the kind's own, else policy.default_timeout_s)")
TimeoutS = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)]
TIMESTAMP = "RFC 3339, UTC, milliseconds"


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

    type: str = Field(examples=["capacity"], description="what went wrong, one of the types "
                      "listed in docs/api.md; clients branch on it")
    message: str = Field(examples=["tier 'free' is at its bound of 240 queued jobs"],
                         description="one human sentence")
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
        description="429: the limit hit: bound or deadline (capacity), quota, rate or cap "
                    "(tenant_limit); its figures follow (bound, quota, rate_per_s, max_wait_s; "
                    "cap: tenant_cap, tenant_inflight, bound, tier_queued; a deadline the "
                    "tenant's own cap causes adds tenant_cap, tenant_inflight and "
                    "tenant_queued_ahead)",
    )
    bound: int | None = Field(default=None, description="429 bound: the tier's queue bound")
    tier_queued: int | None = Field(default=None, description="429 bound: jobs the tier has "
                                    "queued")
    quota: int | None = Field(default=None, description="429 quota: the tenant's queued quota")
    tenant_queued: int | None = Field(default=None, description="429 quota: jobs the tenant "
                                      "has queued")
    rate_per_s: float | None = Field(default=None, description="429 rate: the tenant's "
                                     "submits per second")
    burst: int | None = Field(default=None, description="429 rate: the tenant's burst")
    estimated_wait_s: float | None = Field(default=None, description="429 deadline: when the "
                                           "job would have started, in seconds from now")
    max_wait_s: float | None = Field(default=None, description="429 deadline: the job's own "
                                     "max_wait_s")
    tenant_cap: int | None = Field(default=None, description="429 deadline, when the "
                                   "tenant's own jobs make it late: its cap")
    tenant_inflight: int | None = Field(default=None, description="429 deadline: the "
                                        "tenant's running jobs")
    tenant_queued_ahead: int | None = Field(default=None, description="429 deadline: the "
                                            "tenant's queued jobs ahead of this one")
    job_id: str | None = Field(default=None, description="404, 409, 410: the job named")
    job_error: str | None = Field(default=None, description="job_failed: the job's error")
    limit_bytes: int | None = Field(default=None, description="payload_too_large: the limit")


class ErrorResponse(BaseModel):
    """Every answer that is not a success."""

    error: ErrorDetail = Field(description="what went wrong")


# -- jobs ------------------------------------------------------------------------------------

POSITION = "queued jobs ahead of this one in dispatch order, all tenants; null unless queued"
ESTIMATE = ("seconds until it is expected to start: the later of the pool's start and a slot "
            "under the tenant's own cap; null unless queued, or when it cannot be estimated")
JOB_ID = "the job's id (a UUID)"
TIER = "the tier the job was submitted under (the tenant's, never the client's choice)"
STATUS = "the job's state (docs/states.md)"


class SubmitRequest(_Request):
    """A job to run. The tier comes from the key's tenant; no field can choose it."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"kind": "sleep", "payload": {"seconds": 2}, "idempotency_key": "run-7",
         "max_wait_s": 3600, "max_attempts": 3, "timeout_s": 600},
    ]})

    kind: Annotated[str, Field(min_length=1, max_length=100, examples=["sleep"],
                               description="the handler that runs the job (the kinds this "
                               "deployment has are listed in the schema's enum)")]
    payload: dict[str, Any] = Field(
        default_factory=dict, examples=[{"seconds": 2}],
        description="the job's input, a JSON object the kind's handler validates")
    idempotency_key: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, examples=["run-7"],
        description="unique per tenant: the same key with the same kind and payload answers "
                    "200 with the first job; with another kind or payload, 409 "
                    "idempotency_conflict")
    max_wait_s: Annotated[float, Field(gt=0, le=MAX_WAIT_LIMIT_S, allow_inf_nan=False)] | None = (
        Field(default=None, examples=[3600],
              description="seconds: not started by then, the job expires and is never "
                          "computed; a submit that could not start in time is refused "
                          "(429 capacity, limit deadline)"))
    max_attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS_LIMIT)] | None = Field(
        default=None, examples=[3],
        description="starts allowed before the job fails (default: the policy's)")
    timeout_s: TimeoutS | None = Field(default=None, examples=[600], description=TIMEOUT)
    webhook: WebhookRequest | None = Field(
        default=None, description="POST each event of the job there (docs/api.md, Webhooks)")


class JobLinks(BaseModel):
    """Where a job's state and result are."""

    self_: str = Field(alias="self", description="the job: GET for its state")
    result: str = Field(description="its result: GET once it has finished")

    @classmethod
    def for_job(cls, job_id: str) -> JobLinks:
        return cls(self=f"/v1/jobs/{job_id}", result=f"/v1/jobs/{job_id}/result")


class SubmitResponse(BaseModel):
    """The accepted job (202), or the job its idempotency key already named (200)."""

    id: str = Field(description=JOB_ID)
    status: Status = Field(description=STATUS)
    tier: str = Field(description=TIER)
    queue_position: int | None = Field(description=POSITION)
    estimated_wait_s: float | None = Field(description=ESTIMATE)
    links: JobLinks = Field(description="where to look next")

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


class ProgressView(BaseModel):
    """How far its handler says it got (``ctx.progress``)."""

    fraction: float = Field(ge=0, le=1, description="done, from 0 to 1")
    message: str | None = Field(description="what the handler said with it (200 characters "
                                "at most), or null")
    at: str = Field(description=f"when it was reported ({TIMESTAMP})")

    @classmethod
    def of(cls, report: Report | None) -> ProgressView | None:
        if report is None:
            return None
        return cls(fraction=report.fraction, message=report.message,
                   at=rfc3339(report.at) or "")


class JobResponse(BaseModel):
    """A job as it is now."""

    id: str = Field(description=JOB_ID)
    kind: str = Field(description="the handler that runs it")
    tier: str = Field(description=TIER)
    status: Status = Field(description=STATUS)
    attempt: int = Field(description="its trips through the dispatcher, from 1; moves on each "
                         "time the job goes back to the queue")
    max_attempts: int = Field(description="starts allowed before it fails")
    starts: int = Field(
        default=0, description="Attempts that started: what max_attempts limits (a job "
        "handed back before it started is not charged)."
    )
    queue_position: int | None = Field(description=POSITION)
    estimated_wait_s: float | None = Field(description=ESTIMATE)
    created_at: str | None = Field(description=f"when it was submitted ({TIMESTAMP})")
    enqueued_at: str | None = Field(description="when it entered the queue; kept on a retry, "
                                    "so its ageing is not lost")
    dispatched_at: str | None = Field(description="when the dispatcher last sent it to a "
                                      "worker; null before")
    started_at: str | None = Field(description="when its latest start began; null if it "
                                   "never started")
    finished_at: str | None = Field(description="when it reached a terminal state")
    error: str | None = Field(description="why it failed, expired after a start, or was "
                              "retried; null otherwise")
    max_wait_s: float | None = Field(description="its own deadline to start, in seconds")
    timeout_s: float | None = Field(default=None, description="seconds one attempt may run "
                                    "(docs/api.md, Run-time limit)")
    error_type: ErrorType | None = Field(
        default=None, description="why it ended badly, beside error: handler_error, "
        "timed_out, lease_lost, starts_exhausted, deadline or result_unstorable; null "
        "otherwise")
    cancel_requested: bool = Field(description="a cancel was asked while it ran; its handler "
                                   "stops cooperatively")
    progress: ProgressView | None = Field(
        default=None, description="its handler's latest progress report while it runs (this "
        "attempt's), the last one once it ended; null when it reported none")
    retry_of: str | None = Field(default=None, description="the ended job this one retries "
                                 "(POST /v1/jobs/<id>/retry); null otherwise")
    custom_id: str | None = Field(default=None, description="a batch item's id of the "
                                  "client's own (an envelope's custom_id); null otherwise")
    run_items: int | None = Field(default=None, description="how many items the run of its "
                                  "latest start held (packing: items of one kind sharing "
                                  "one handler call); 1 when it ran alone, null before it "
                                  "started")
    batch_id: str | None = Field(default=None, description="the batch it is an item of; null "
                                 "for a job of its own")
    webhook: WebhookRequest | None = Field(
        default=None, description="where its events are posted, and which (a batch item's are "
        "its batch's: null here)")

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
            timeout_s=job.timeout_s,
            error_type=None if job.error_type is None else ErrorType(job.error_type),
            cancel_requested=job.cancel_requested,
            progress=ProgressView.of(progress.report),
            retry_of=job.retry_of,
            custom_id=job.custom_id,
            run_items=job.run_items if job.run_items is not None
            else None if job.started_at is None else 1,
            batch_id=job.batch_id,
            webhook=None if job.webhook_url is None or job.batch_id is not None
            else WebhookRequest(url=job.webhook_url, events=list(events_of(job.webhook_events))),
        )


class JobListResponse(BaseModel):
    """One page of the tenant's jobs, newest first."""

    jobs: list[JobResponse] = Field(description="this page, newest first")
    next_cursor: str | None = Field(description="pass as cursor for the next page; null on "
                                    "the last")


class ResultResponse(BaseModel):
    """The result of a job that succeeded."""

    id: str = Field(description=JOB_ID)
    status: Status = Field(description="succeeded")
    result: Any = Field(default=None, description="what the handler returned (JSON); null "
                        "when result_url is set")
    result_url: str | None = Field(
        default=None, description="set instead of result when the result is larger than "
        "result_inline_bytes: GET it (same key) for the result's JSON")
    result_bytes: int | None = Field(default=None, ge=0,
                                     description="the size of the result behind result_url")


class PendingResultResponse(BaseModel):
    """202 from ``/result``: not finished yet; come back after ``Retry-After``."""

    id: str = Field(description=JOB_ID)
    status: Status = Field(description=STATUS)
    queue_position: int | None = Field(description=POSITION)
    estimated_wait_s: float | None = Field(description=ESTIMATE)


class CancelResponse(BaseModel):
    """Where a cancel left the job."""

    id: str = Field(description=JOB_ID)
    status: Status = Field(description="cancelled; or running while its handler stops; or "
                           "the terminal state it had already reached")
    cancel_requested: bool = Field(description="true when the job was running: its handler "
                                   "has been asked to stop")


# -- tenants ---------------------------------------------------------------------------------

TIER_NAME = "a configured tier (the schema's enum lists them)"


class TenantCreateRequest(_Request):
    """A new tenant; its API key is in the answer, once."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "acme",
                                                               "tier": "premium"}]})

    name: Annotated[str, Field(pattern=NAME_PATTERN, examples=["acme"],
                               description="unique; letters, digits, '.', '_' and '-'")]
    tier: Annotated[str, Field(min_length=1, max_length=64, examples=["premium"],
                               description=TIER_NAME)]


class TenantPatchRequest(_Request):
    """Fields left out stay as they are; ``null`` clears an override (the tier's applies).
    Changes apply to jobs submitted afterwards."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"tier": "standard", "cap": 4, "max_queued": 100, "rate_per_s": 5, "rate_burst": 20},
        {"cap": None},
    ]})

    tier: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        default=None, description=f"move the tenant to {TIER_NAME}")
    cap: Annotated[int, Field(ge=1, le=MAX_TENANT_CAP)] | None = Field(
        default=None, examples=[4], description="jobs it may run at once, over the fleet")
    max_queued: Annotated[int, Field(ge=1, le=MAX_TENANT_QUEUED)] | None = Field(
        default=None, examples=[100], description="jobs it may have queued at once")
    rate_per_s: Annotated[float, Field(gt=0, le=MAX_TENANT_RATE_PER_S,
                                       allow_inf_nan=False)] | None = Field(
        default=None, examples=[5], description="submits per second, sustained")
    rate_burst: Annotated[int, Field(ge=1, le=MAX_TENANT_BURST)] | None = Field(
        default=None, examples=[20], description="submits at once above the rate")


class TenantResponse(BaseModel):
    """A tenant (never its key: only the key's hash is stored)."""

    id: str = Field(description="the tenant's id (a UUID)")
    name: str = Field(description="its unique name")
    tier: str = Field(description="its tier: every job it submits is of this tier")
    created_at: str | None = Field(description=f"when it was created ({TIMESTAMP})")
    cap: int | None = Field(default=None, description="override of the tier's tenant cap")
    max_queued: int | None = Field(default=None, description="override of the tier's quota")
    rate_per_s: float | None = Field(default=None, description="override of the tier's rate")
    rate_burst: int | None = Field(default=None, description="override of the tier's burst")


class TenantWithKeyResponse(TenantResponse):
    """A tenant with its new API key."""

    api_key: str = Field(description="shown once; only its hash is stored")


class TenantListResponse(BaseModel):
    """Every tenant, by name."""

    tenants: list[TenantResponse] = Field(description="by name")
