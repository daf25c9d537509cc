"""``/v1/admin/tenants``: create, list, change (tier, overrides of the tier's limits) and
re-key tenants (admin key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from jobs.api.deps import AdminDep, RuntimeDep, TenantCacheDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.api.schemas import (
    TenantCreateRequest,
    TenantListResponse,
    TenantPatchRequest,
    TenantResponse,
    TenantWithKeyResponse,
    rfc3339,
)
from jobs.core.domain import Tenant
from jobs.service import tenants

router = APIRouter(prefix="/v1/admin/tenants", tags=["tenants"],
                   dependencies=[Depends(refuse_unknown_query)])

_COMMON = ("unauthorized", "forbidden", "unavailable")
TenantIdPath = Annotated[str, Path(description="the tenant's id (a UUID)",
                                   examples=["5f0c3a52-3c1b-4f37-9d43-2a4f1e0b7c11"])]


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
    description="A tenant of a configured tier. The answer holds its API key, the only time "
    "it is shown: only its hash is stored.",
    responses=error_responses(*_COMMON, "invalid_request", "payload_too_large"),
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
    description="Every tenant, by name, with its tier and overrides.",
    responses=error_responses(*_COMMON),
)
def list_tenants(_: AdminDep, runtime: RuntimeDep) -> TenantListResponse:
    return TenantListResponse(tenants=[_view(t) for t in tenants.list_tenants(runtime)])


@router.patch(
    "/{tenant_id}",
    response_model=TenantResponse,
    summary="Change a tenant's tier or its overrides",
    description="Change the tier, or override the tier's cap, max_queued, rate_per_s or "
    "rate_burst for this tenant; a field left out stays as it is, null clears an override. "
    "Applies to jobs submitted afterwards, in every API process at once.",
    responses=error_responses(*_COMMON, "invalid_request", "not_found", "payload_too_large"),
)
def patch_tenant(
    tenant_id: TenantIdPath, body: TenantPatchRequest, _: AdminDep, runtime: RuntimeDep,
    cache: TenantCacheDep,
) -> TenantResponse:
    changes = body.model_dump(exclude_unset=True)
    return _view(tenants.update_tenant(runtime, tenant_id, cache=cache, **changes))


@router.post(
    "/{tenant_id}/rotate-key",
    response_model=TenantWithKeyResponse,
    summary="Give a tenant a new API key; the old one stops working",
    description="A new key, shown once; the old key stops working at once, in every API "
    "process.",
    responses=error_responses(*_COMMON, "invalid_request", "not_found"),
)
def rotate_key(
    tenant_id: TenantIdPath, _: AdminDep, runtime: RuntimeDep, cache: TenantCacheDep
) -> TenantWithKeyResponse:
    tenant, key = tenants.rotate_key(runtime, tenant_id, cache=cache)
    return _with_key(tenant, key)
