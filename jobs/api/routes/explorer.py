"""The job explorer's routes: ``/v1/admin/jobs`` (search every tenant's jobs, read, cancel
and retry any of them; admin key) and ``/v1/jobs/{job_id}/detail`` (a tenant's own job read
whole, with its payload). The tenant's search is ``GET /v1/jobs`` (``jobs.api.routes.jobs``),
with the same filters (``jobs.api.explorer_schemas.job_filters``).

Handlers are thin: each calls ``jobs.service.explorer``, whose admin cancel and retry are the
tenant's own (``jobs.service.jobs``) acting on the job's tenant.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from jobs.admission import estimates
from jobs.api.deps import AdminDep, RuntimeDep, TenantDep, ValidatorDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.api.explorer_schemas import (
    AdminJobListResponse,
    AdminJobResponse,
    JobDetailResponse,
    job_filters,
)
from jobs.api.routes.jobs import RetryKey, cancel_answer
from jobs.api.schemas import CancelResponse, SubmitResponse
from jobs.service import explorer
from jobs.service import jobs as job_service
from jobs.service.explorer import Filters

router = APIRouter(tags=["explorer"], dependencies=[Depends(refuse_unknown_query)])

MAX_PAGE = 500
FiltersDep = Annotated[Filters, Depends(job_filters)]
JobIdPath = Annotated[str, Path(description="the job's id",
                                examples=["0190b6f0-6c4e-7a35-9a3c-1f0e2d3c4b5a"])]
_READ = ("invalid_request", "unauthorized", "forbidden", "not_found", "job_gone",
         "unavailable")


@router.get(
    "/v1/admin/jobs",
    response_model=AdminJobListResponse,
    summary="Every tenant's jobs, newest first, filtered",
    description="One page of the jobs of every tenant (or of one: tenant, its id or name) "
    "matching every filter given: status, kind, tier, and creation time (since inclusive, "
    "until exclusive). Each job names its tenant. Follow next_cursor for the next page.",
    responses=error_responses("invalid_request", "unauthorized", "forbidden", "unavailable"),
)
def search_jobs(
    _: AdminDep,
    runtime: RuntimeDep,
    validator: ValidatorDep,
    filters: FiltersDep,
    tenant: Annotated[str | None, Query(min_length=1, max_length=200,
                                        description="only this tenant's jobs: its id or "
                                        "its name")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="jobs per page")] = 50,
    cursor: Annotated[str | None, Query(max_length=200,
                                        description="next_cursor of the previous page")] = None,
) -> AdminJobListResponse:
    owner = None if tenant is None else explorer.tenant_named(runtime, tenant).id
    query = explorer.query_of(runtime, validator, filters, tenant_id=owner)
    found, next_cursor = explorer.search(runtime, query, limit=limit, cursor=cursor)
    return AdminJobListResponse(jobs=[AdminJobResponse.found(f) for f in found],
                                next_cursor=next_cursor)


@router.get(
    "/v1/admin/jobs/{job_id}",
    response_model=JobDetailResponse,
    summary="Any tenant's job, read whole",
    description="The job as its tenant reads it, with its tenant and its payload (cut when "
    "its JSON is over 4096 bytes). 404 when no job has this id; 410 job_gone when it was "
    "pruned after its retention period.",
    responses=error_responses(*_READ),
)
def get_any_job(job_id: JobIdPath, _: AdminDep, runtime: RuntimeDep) -> JobDetailResponse:
    job, tenant = explorer.any_job(runtime, job_id)
    return JobDetailResponse.read(estimates.progress(runtime, tenant, job), tenant,
                                  explorer.shown_payload(job.payload))


@router.post(
    "/v1/admin/jobs/{job_id}/cancel",
    response_model=CancelResponse,
    summary="Cancel any tenant's job",
    description="As its tenant's POST /v1/jobs/{job_id}/cancel: a job that has not started "
    "is cancelled at once (200); a running one is asked to stop (202); a finished one is "
    "left as it is (200 with its status).",
    responses={
        200: {"description": "cancelled (it had not started), or already finished: its status"},
        202: {"model": CancelResponse,
              "description": "running: cancellation requested from its handler"},
        **error_responses(*_READ),
    },
)
def cancel_any_job(
    job_id: JobIdPath, _: AdminDep, runtime: RuntimeDep, response: Response
) -> CancelResponse:
    return cancel_answer(explorer.cancel_any(runtime, job_id), response)


@router.post(
    "/v1/admin/jobs/{job_id}/retry",
    status_code=202,
    response_model=SubmitResponse,
    summary="Submit any tenant's ended job again",
    description="As its tenant's POST /v1/jobs/{job_id}/retry, under that tenant's tier and "
    "limits: a failed, expired or cancelled job is submitted again as a new job naming it in "
    "retry_of (202, or 429); a job that has not ended, or that succeeded, is 409 "
    "job_not_ended. An Idempotency-Key header (the tenant's keys) makes it safe to send "
    "again: the same key answers 200 with the job it made.",
    responses={
        200: {"model": SubmitResponse,
              "description": "this Idempotency-Key made a retry of this job before: the same "
                             "new job, no second one"},
        202: {"description": "the new job, accepted and queued",
              "headers": {"Location": {"description": "/v1/admin/jobs/<id> of the new job",
                                       "schema": {"type": "string"}}}},
        **error_responses(*_READ, "job_not_ended", "idempotency_conflict", "capacity",
                          "tenant_limit"),
    },
)
def retry_any_job(
    job_id: JobIdPath, _: AdminDep, runtime: RuntimeDep, validator: ValidatorDep,
    response: Response, idempotency_key: RetryKey = None,
) -> SubmitResponse:
    submitted = explorer.retry_any(runtime, validator, job_id, idempotency_key)
    response.headers["Location"] = f"/v1/admin/jobs/{submitted.progress.job.id}"
    if not submitted.created:
        response.status_code = 200
    return SubmitResponse.of(submitted.progress)


@router.get(
    "/v1/jobs/{job_id}/detail",
    response_model=JobDetailResponse,
    summary="This tenant's job, read whole",
    description="The job as GET /v1/jobs/{job_id} answers it, with its tenant and its "
    "payload (cut when its JSON is over 4096 bytes). Another tenant's job is 404.",
    responses=error_responses(*_READ),
)
def get_job_detail(job_id: JobIdPath, tenant: TenantDep, runtime: RuntimeDep) -> JobDetailResponse:
    job = job_service.load_job(runtime, tenant, job_id)
    return JobDetailResponse.read(estimates.progress(runtime, tenant, job), tenant,
                                  explorer.shown_payload(job.payload))
