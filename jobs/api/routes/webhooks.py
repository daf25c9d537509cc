"""Webhooks: the tenant's signing secret and its rotation, and what was delivered for a job
or a batch (docs/api.md, Webhooks)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from jobs.api.deps import AdminDep, RuntimeDep, TenantDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.api.routes.batches import BatchIdPath
from jobs.api.routes.jobs import JobIdPath
from jobs.api.schemas import rfc3339
from jobs.api.webhook_schemas import DeliveriesResponse, WebhookSecretResponse
from jobs.process.runtime import Runtime
from jobs.service import batches, explorer
from jobs.service import jobs as job_service
from jobs.service.deliverer import rotate_secret, tenant_secrets
from jobs.store import webhooks as webhooks_sql
from jobs.store.webhooks import Secrets

router = APIRouter(tags=["webhooks"], dependencies=[Depends(refuse_unknown_query)])
_ERRORS = ("unauthorized", "forbidden", "unavailable")
_READ = ("invalid_request", "unauthorized", "forbidden", "not_found", "unavailable")


def _secret(found: Secrets) -> WebhookSecretResponse:
    return WebhookSecretResponse(secret=found.current,
                                 previous_valid_until=rfc3339(found.previous_until))


@router.get("/v1/webhooks/secret", response_model=WebhookSecretResponse,
            summary="The tenant's webhook signing secret",
            description="The secret (whsec_…) every webhook of this tenant is signed with, as "
            "the Standard Webhooks specification says; made on first use.",
            responses=error_responses(*_ERRORS))
async def get_secret(tenant: TenantDep, runtime: RuntimeDep) -> WebhookSecretResponse:
    return _secret(await run_in_threadpool(tenant_secrets, runtime, tenant.id))


@router.post("/v1/webhooks/secret/rotate", response_model=WebhookSecretResponse,
             summary="Make a new webhook signing secret",
             description="The new secret signs from now on; the one it replaces signs beside "
             "it for 24 hours (both signatures are sent), so receivers can switch over.",
             responses=error_responses(*_ERRORS))
async def rotate(tenant: TenantDep, runtime: RuntimeDep) -> WebhookSecretResponse:
    return _secret(await run_in_threadpool(rotate_secret, runtime, tenant.id))


def _deliveries(runtime: Runtime, *, job_id: str | None = None,
                batch_id: str | None = None) -> DeliveriesResponse:
    with runtime.sessions() as session:
        found = webhooks_sql.deliveries(session, job_id=job_id, batch_id=batch_id)
    return DeliveriesResponse.of(found, rfc3339)


@router.get("/v1/jobs/{job_id}/deliveries", response_model=DeliveriesResponse,
            summary="A job's webhook deliveries",
            description="Each event recorded for the job's webhook (or its batch's "
            "batch.item.completed), with every try: when, the status code or the error.",
            responses=error_responses(*_READ, "job_gone"))
async def job_deliveries(job_id: JobIdPath, tenant: TenantDep,
                         runtime: RuntimeDep) -> DeliveriesResponse:
    job = await run_in_threadpool(job_service.load_job, runtime, tenant, job_id)
    return await run_in_threadpool(lambda: _deliveries(runtime, job_id=job.id))


@router.get("/v1/batches/{batch_id}/deliveries", response_model=DeliveriesResponse,
            summary="A batch's webhook deliveries",
            description="The batch's own events (batch.completed) with every try; its items' "
            "are under each item's job.", responses=error_responses(*_READ))
async def batch_deliveries(batch_id: BatchIdPath, tenant: TenantDep,
                           runtime: RuntimeDep) -> DeliveriesResponse:
    batch = await run_in_threadpool(batches.load, runtime, tenant, batch_id)
    return await run_in_threadpool(lambda: _deliveries(runtime, batch_id=batch.id))


@router.get("/v1/admin/jobs/{job_id}/deliveries", response_model=DeliveriesResponse,
            summary="Any job's webhook deliveries (admin)",
            description="As GET /v1/jobs/<id>/deliveries, for any tenant's job.",
            responses=error_responses(*_READ, "job_gone"))
async def admin_job_deliveries(job_id: JobIdPath, _: AdminDep,
                               runtime: RuntimeDep) -> DeliveriesResponse:
    job, _tenant = await run_in_threadpool(explorer.any_job, runtime, job_id)
    return await run_in_threadpool(lambda: _deliveries(runtime, job_id=job.id))
