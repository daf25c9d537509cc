"""``/v1/admin/tenants``: create, list, change (tier, overrides of the tier's limits) and
re-key tenants (admin key)."""

from __future__ import annotations

from fastapi import APIRouter

from jobs import tenants
from jobs.api.deps import AdminDep, RuntimeDep, TenantCacheDep
from jobs.api.errors import error_responses
from jobs.api.schemas import (
    TenantCreateRequest,
    TenantListResponse,
    TenantPatchRequest,
    TenantResponse,
    TenantWithKeyResponse,
    rfc3339,
)
from jobs.domain import Tenant

router = APIRouter(prefix="/v1/admin/tenants", tags=["tenants"])

_COMMON = (401, 403, 503)


def _view(tenant: Tenant) -> TenantResponse:
    return TenantResponse(
        id=tenant.id, name=tenant.name, tier=tenant.tier, created_at=rfc3339(tenant.created_at),
        cap=tenant.cap, max_queued=tenant.max_queued, rate_per_s=tenant.rate_per_s,
        rate_burst=tenant.rate_burst,
    )


def _with_key(tenant: Tenant, key: str) -> TenantWithKeyResponse:
    return TenantWithKeyResponse(**_view(tenant).model_dump(), api_key=key)


@router.post(
    "",
    status_code=201,
    response_model=TenantWithKeyResponse,
    summary="Create a tenant; its API key is shown once",
    responses=error_responses(*_COMMON, 400, 422),
)
def create_tenant(
    body: TenantCreateRequest, _: AdminDep, runtime: RuntimeDep
) -> TenantWithKeyResponse:
    tenant, key = tenants.create_tenant(runtime, name=body.name, tier=body.tier)
    return _with_key(tenant, key)


@router.get(
    "",
    response_model=TenantListResponse,
    summary="All tenants (never their keys)",
    responses=error_responses(*_COMMON),
)
def list_tenants(_: AdminDep, runtime: RuntimeDep) -> TenantListResponse:
    return TenantListResponse(tenants=[_view(t) for t in tenants.list_tenants(runtime)])


@router.patch(
    "/{tenant_id}",
    response_model=TenantResponse,
    summary="Change a tenant's tier or its overrides (cap, max_queued, rate_per_s, "
            "rate_burst; null clears one); applies to jobs submitted afterwards",
    responses=error_responses(*_COMMON, 400, 404, 422),
)
def patch_tenant(
    tenant_id: str, body: TenantPatchRequest, _: AdminDep, runtime: RuntimeDep,
    cache: TenantCacheDep,
) -> TenantResponse:
    changes = body.model_dump(exclude_unset=True)
    return _view(tenants.update_tenant(runtime, tenant_id, cache=cache, **changes))


@router.post(
    "/{tenant_id}/rotate-key",
    response_model=TenantWithKeyResponse,
    summary="Give a tenant a new API key; the old one stops working",
    responses=error_responses(*_COMMON, 404, 422),
)
def rotate_key(
    tenant_id: str, _: AdminDep, runtime: RuntimeDep, cache: TenantCacheDep
) -> TenantWithKeyResponse:
    tenant, key = tenants.rotate_key(runtime, tenant_id, cache=cache)
    return _with_key(tenant, key)
