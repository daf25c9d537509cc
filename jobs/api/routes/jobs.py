"""``/v1/jobs``: submit, look up (optionally long-polling), fetch the result, cancel, list.

Handlers are thin: each calls ``jobs.admission.submit`` or ``jobs.service.jobs`` and returns a
schema. The sync ones run
in the threadpool; the status long-poll is async and sleeps on a notification of the job's
change (``jobs.index.notify``) between SQL reads, so a thousand waiting clients hold no threads and
cost SQL nothing while they wait.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from jobs.admission import estimates, submit
from jobs.admission.refusals import result_retry_after_s
from jobs.api.deps import (
    BlobStoreDep,
    ListenerDep,
    RuntimeDep,
    TenantDep,
    ValidatorDep,
    refuse_unknown_query,
)
from jobs.api.errors import error_responses
from jobs.api.explorer_schemas import job_filters
from jobs.api.schemas import (
    CancelResponse,
    JobListResponse,
    JobResponse,
    PendingResultResponse,
    ResultResponse,
    SubmitRequest,
    SubmitResponse,
)
from jobs.blobs.store import BlobNotFound
from jobs.core.domain import Job, Tenant
from jobs.core.errors import JobGone, NotFound, Unavailable
from jobs.core.states import Status
from jobs.index.notify import Listener
from jobs.process.runtime import Runtime
from jobs.service import explorer
from jobs.service import jobs as job_service
from jobs.service.explorer import Filters
from jobs.service.jobs import CancelOutcome
from jobs.store import blobs as blobs_sql

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(refuse_unknown_query)])

MAX_LONG_POLL_S = 60.0
MAX_PAGE = 500
# A waiter re-reads SQL this often (times 1 to 1.5, so that many waiters spread out) even
# when no notification came: a lost one delays the answer by this much at most.
SAFETY_NET_S = 10.0
# How often a waiter looks whether its client has left (no SQL involved).
DISCONNECT_CHECK_S = 1.0
_READ = ("invalid_request", "unauthorized", "forbidden", "not_found", "job_gone",
         "unavailable")
JobIdPath = Annotated[str, Path(description="the job's id, from the submit's answer",
                                examples=["0190b6f0-6c4e-7a35-9a3c-1f0e2d3c4b5a"])]


@router.post(
    "",
    status_code=202,
    response_model=SubmitResponse,
    summary="Submit a job",
    description="Admit the job against the tier's bound and the tenant's limits, store it and "
    "queue it: 202 with its place in the queue. The same idempotency_key with the same kind "
    "and payload answers 200 with the first job; with another kind or payload, 409. A 429 "
    "says why and when to come back (Retry-After); nothing was stored.",
    responses={
        200: {"model": SubmitResponse,
              "description": "this idempotency key was used before for the same kind and "
                             "payload: the same job, no second one",
              "headers": {"Location": {"description": "/v1/jobs/<id>",
                                       "schema": {"type": "string"}}}},
        202: {"description": "accepted and queued",
              "headers": {"Location": {"description": "/v1/jobs/<id>",
                                       "schema": {"type": "string"}}}},
        **error_responses("invalid_request", "unauthorized", "forbidden",
                          "idempotency_conflict", "payload_too_large", "capacity",
                          "tenant_limit", "unavailable"),
    },
)
def submit_job(
    body: SubmitRequest,
    tenant: TenantDep,
    runtime: RuntimeDep,
    validator: ValidatorDep,
    response: Response,
) -> SubmitResponse:
    submitted = submit.submit(
        runtime,
        validator,
        tenant,
        submit.Submission(
            kind=body.kind,
            payload=body.payload,
            idempotency_key=body.idempotency_key,
            max_wait_s=body.max_wait_s,
            max_attempts=body.max_attempts,
            timeout_s=body.timeout_s,
            webhook=None if body.webhook is None else body.webhook.webhook(),
        ),
    )
    job_id = submitted.progress.job.id
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    if not submitted.created:
        response.status_code = 200
    return SubmitResponse.of(submitted.progress)


@router.get(
    "",
    response_model=JobListResponse,
    summary="This tenant's jobs, newest first",
    description="One page of the tenant's jobs matching every filter given: status, kind, "
    "tier, and creation time (since inclusive, until exclusive); follow next_cursor for the "
    "next page.",
    responses=error_responses("invalid_request", "unauthorized", "forbidden", "unavailable"),
)
def list_jobs(
    tenant: TenantDep,
    runtime: RuntimeDep,
    validator: ValidatorDep,
    filters: Annotated[Filters, Depends(job_filters)],
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="jobs per page")] = 50,
    cursor: Annotated[str | None, Query(max_length=200,
                                        description="next_cursor of the previous page")] = None,
) -> JobListResponse:
    query = explorer.query_of(runtime, validator, filters, tenant_id=tenant.id)
    found, next_cursor = explorer.search(runtime, query, limit=limit, cursor=cursor)
    return JobListResponse(jobs=[JobResponse.of(f.progress) for f in found],
                           next_cursor=next_cursor)


@router.get(
    "/{job_id}",
    response_model=JobResponse,
    summary="A job's state; with wait, long-poll until it changes",
    description="The job as it is now. With wait, the answer comes as soon as its status "
    "differs from what it was when the call arrived, or it is terminal, at the latest after "
    "wait seconds.",
    responses=error_responses(*_READ),
)
async def get_job(
    job_id: JobIdPath,
    tenant: TenantDep,
    runtime: RuntimeDep,
    listener: ListenerDep,
    request: Request,
    wait: Annotated[float | None, Query(
        ge=0, le=MAX_LONG_POLL_S, allow_inf_nan=False,
        description="seconds to wait for a change of state (at most 60)")] = None,
) -> JobResponse:
    if wait:
        job = await _wait_for_change(runtime, listener, tenant, job_id, wait, request)
    else:
        job = await run_in_threadpool(job_service.load_job, runtime, tenant, job_id)
    progress = await run_in_threadpool(estimates.progress, runtime, tenant, job)
    return JobResponse.of(progress)


async def _wait_for_change(
    runtime: Runtime, listener: Listener, tenant: Tenant, job_id: str, wait_s: float,
    request: Request,
) -> Job:
    """The job once its status differs from the first read's, it is terminal, the client
    leaves, or ``wait_s`` passes (real time: the runtime clock may be simulated).

    SQL is read at the start, on each notification of this job, and at the end; between, only
    every safety-net period. The waiter is registered before the first read, so a change
    committed after that read rings it; a ring with the status unchanged (another change of
    the job, or a dropped subscription) costs one read and the wait goes on."""
    deadline = time.monotonic() + wait_s
    listener.start()
    waiter = listener.waiters.add(job_service.parse_job_id(job_id), asyncio.get_running_loop())
    try:
        job = await run_in_threadpool(job_service.load_job, runtime, tenant, job_id)
        start_status = job.status
        safety_at = time.monotonic() + _safety_net_s()
        while not job.terminal and job.status is start_status:
            now = time.monotonic()
            due = min(deadline, safety_at)
            rung = await waiter.wait(min(due, now + DISCONNECT_CHECK_S) - now)
            if await request.is_disconnected():
                break
            now = time.monotonic()
            if rung or now >= due:
                job = await run_in_threadpool(job_service.load_job, runtime, tenant, job.id)
                safety_at = time.monotonic() + _safety_net_s()
            if now >= deadline:
                break
    finally:
        listener.waiters.discard(waiter)
    return job


def _safety_net_s() -> float:
    return SAFETY_NET_S * random.uniform(1.0, 1.5)


@router.get(
    "/{job_id}/result",
    response_model=ResultResponse,
    summary="The result of a succeeded job",
    description="200 with the result once the job succeeded; 202 with Retry-After while it "
    "is not finished; 409 when it failed, 410 when it was cancelled or expired, or pruned "
    "after its retention period (job_gone).",
    responses={
        202: {"model": PendingResultResponse, "description": "not finished yet",
              "headers": {"Retry-After": {"description": "seconds, 1 to 5",
                                          "schema": {"type": "integer", "minimum": 1}}}},
        **error_responses(*_READ, "job_failed", "job_cancelled", "job_expired"),
    },
)
def get_result(
    job_id: JobIdPath, tenant: TenantDep, runtime: RuntimeDep
) -> ResultResponse | JSONResponse:
    job = job_service.load_job(runtime, tenant, job_id)
    if job.terminal:
        result = job_service.hand_out_result(runtime, job)
        if job.result_blob is not None:
            return ResultResponse(id=job.id, status=job.status,
                                  result_url=f"/v1/jobs/{job.id}/result/blob",
                                  result_bytes=blob_size(runtime, job.result_blob))
        return ResultResponse(id=job.id, status=job.status, result=result)
    progress = estimates.progress(runtime, tenant, job)
    retry_after = result_retry_after_s(
        running=job.status is not Status.QUEUED,
        estimated_wait_s=progress.estimated_wait_s,
        mean_service_s=runtime.policy.mean_service_s,
    )
    pending = PendingResultResponse(
        id=job.id,
        status=job.status,
        queue_position=progress.queue_position,
        estimated_wait_s=progress.estimated_wait_s,
    )
    return JSONResponse(
        pending.model_dump(mode="json"), status_code=202,
        headers={"Retry-After": str(retry_after)},
    )


@router.get(
    "/{job_id}/result/blob",
    summary="A result too large to keep inline",
    description="The result's JSON, when /result answered result_url instead of result. 404 "
    "when the job's result is inline (or the job is not the caller's); the other answers as "
    "for /result.",
    response_class=Response,
    responses={
        200: {"description": "the result's JSON",
              "content": {"application/json": {"schema": {}}}},
        **error_responses(*_READ, "job_failed", "job_cancelled", "job_expired"),
    },
)
def get_result_blob(
    job_id: JobIdPath, tenant: TenantDep, runtime: RuntimeDep, store: BlobStoreDep
) -> Response:
    job = job_service.load_job(runtime, tenant, job_id)
    if job.terminal:
        job_service.finished_result(job)  # the typed error of a job that did not succeed
    if job.result_blob is None:
        raise NotFound("this job has no result blob: its result is inline at /result, or "
                       "it has not finished", job_id=job.id)
    try:
        data = store.get(job.result_blob)
    except BlobNotFound:
        raise JobGone("the result is gone from the blob store", type="job_gone",
                      job_id=job.id) from None
    except OSError as exc:
        raise Unavailable("the blob store cannot be read; retry", retry_after_s=5) from exc
    return Response(content=data, media_type="application/json")


@router.post(
    "/{job_id}/cancel",
    response_model=CancelResponse,
    summary="Cancel a job",
    description="A job that has not started is cancelled at once (200); a running one is "
    "asked to stop (202, cancel_requested) and ends cancelled when its handler stops; a "
    "finished one is left as it is (200 with its status).",
    responses={
        200: {"description": "cancelled (it had not started), or already finished: its status"},
        202: {"model": CancelResponse,
              "description": "running: cancellation requested from its handler"},
        **error_responses(*_READ),
    },
)
def cancel_job(
    job_id: JobIdPath, tenant: TenantDep, runtime: RuntimeDep, response: Response
) -> CancelResponse:
    return cancel_answer(job_service.cancel(runtime, tenant, job_id), response)


def cancel_answer(outcome: CancelOutcome, response: Response) -> CancelResponse:
    """A cancel's answer: 202 while a running job is asked to stop, else 200."""
    if outcome.pending:
        response.status_code = 202
    job = outcome.job
    return CancelResponse(id=job.id, status=job.status, cancel_requested=job.cancel_requested)


def blob_size(runtime: Runtime, sha256: str) -> int | None:
    """The size of a stored blob, as recorded when it was written."""
    with runtime.sessions() as session:
        return blobs_sql.blob_size(session, sha256)


# A retry's own idempotency key: one per retry a client makes, the same on each resend.
RetryKey = Annotated[str | None, Header(
    alias="Idempotency-Key", min_length=1, max_length=200,
    description="unique per tenant, one per retry a client makes (the same on each resend "
                "of it): the same key again answers 200 with the job it made; a key used "
                "for other work, 409 idempotency_conflict")]


@router.post(
    "/{job_id}/retry",
    status_code=202,
    response_model=SubmitResponse,
    summary="Submit an ended job again",
    description="A failed, expired or cancelled job is submitted again as a new job with the "
    "same kind, payload and limits, through admission like any submit (202, or 429); the new "
    "job names it in retry_of, and it is left as it was. A job that has not ended, or that "
    "succeeded, is 409 job_not_ended. An Idempotency-Key header makes the retry safe to send "
    "again: the same key answers 200 with the job it made; a key used for other work is 409 "
    "idempotency_conflict.",
    responses={
        200: {"model": SubmitResponse,
              "description": "this Idempotency-Key made a retry of this job before: the same "
                             "new job, no second one",
              "headers": {"Location": {"description": "/v1/jobs/<id> of the new job",
                                       "schema": {"type": "string"}}}},
        202: {"description": "the new job, accepted and queued",
              "headers": {"Location": {"description": "/v1/jobs/<id> of the new job",
                                       "schema": {"type": "string"}}}},
        **error_responses(*_READ, "job_not_ended", "idempotency_conflict", "capacity",
                          "tenant_limit"),
    },
)
def retry_job(
    job_id: JobIdPath, tenant: TenantDep, runtime: RuntimeDep, validator: ValidatorDep,
    response: Response,
    idempotency_key: RetryKey = None,
) -> SubmitResponse:
    submitted = job_service.retry(runtime, validator, tenant, job_id, idempotency_key)
    response.headers["Location"] = f"/v1/jobs/{submitted.progress.job.id}"
    if not submitted.created:
        response.status_code = 200
    return SubmitResponse.of(submitted.progress)
