"""Who is calling: a tenant (by its key's hash) or the operator (the admin key).

The two kinds of key do disjoint things: a tenant key works with that tenant's jobs, the
admin key manages tenants and nothing else, so a leaked admin key cannot run GPU work and a
tenant key cannot mint tenants. Either may read ``/v1/queues``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from jobs.core.domain import Tenant
from jobs.core.errors import Forbidden, Unauthorized
from jobs.process.runtime import Runtime
from jobs.process.settings import Settings
from jobs.service.tenant_cache import TenantCache
from jobs.service.tenants import hash_key, tenant_for_key


@dataclass(frozen=True, kw_only=True)
class Principal:
    """The caller: the admin, or a tenant."""

    tenant: Tenant | None = None
    admin: bool = False


def is_admin_key(settings: Settings, key: str) -> bool:
    """Constant-time comparison (on bytes: ``compare_digest`` refuses non-ASCII text)."""
    if not settings.admin_key:
        return False
    return hmac.compare_digest(key.encode("utf-8"), settings.admin_key.encode("utf-8"))


def authenticate(
    runtime: Runtime, key: str | None, cache: TenantCache | None = None
) -> Principal:
    """The principal holding ``key``; 401 when there is none or nobody holds it. A tenant
    key is looked up in ``cache`` first (``jobs.service.tenant_cache``)."""
    if not key:
        raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
    if is_admin_key(runtime.settings, key):
        return Principal(admin=True)
    tenant = tenant_for_key(runtime, key, cache)
    if tenant is None:
        raise Unauthorized("unknown API key")
    return Principal(tenant=tenant)


def known_principal(
    runtime: Runtime, key: str | None, cache: TenantCache
) -> Principal | None:
    """The principal ``authenticate`` would find, when that needs no I/O: no key (401), the
    admin key, or a tenant key ``cache`` holds; None: look it up."""
    if not key:
        raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
    if is_admin_key(runtime.settings, key):
        return Principal(admin=True)
    tenant = cache.get(hash_key(key))
    return None if tenant is None else Principal(tenant=tenant)


def require_tenant(principal: Principal) -> Tenant:
    if principal.tenant is None:
        raise Forbidden("the admin key only manages tenants; use a tenant's key for jobs")
    return principal.tenant


def require_admin(runtime: Runtime, key: str | None) -> Principal:
    """The admin; 403 when admin routes are off or a tenant key is used, 401 otherwise."""
    if not runtime.settings.admin_key:
        raise Forbidden("tenant management is disabled: TIERQ_ADMIN_KEY is not set")
    principal = authenticate(runtime, key)
    if not principal.admin:
        raise Forbidden("a tenant key cannot manage tenants; use the admin key")
    return principal
