"""Dependencies of the route handlers, as ``Annotated`` aliases.

``RuntimeDep`` (connections and policy), ``ValidatorDep`` (the handler registry that checks
payloads), ``TenantDep`` (a tenant key's tenant), ``AdminDep`` (the admin key),
``PrincipalDep`` (either), ``ListenerDep`` (this process's ``jobs.notify.Listener``) and
``TenantCacheDep`` (its ``jobs.tenant_cache.TenantCache``). The sync ones run in the
threadpool: key lookups may touch SQL.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jobs.api.auth import Principal, authenticate, require_admin, require_tenant
from jobs.domain import Tenant
from jobs.notify import Listener
from jobs.runtime import Runtime
from jobs.submission import PayloadValidator
from jobs.tenant_cache import TenantCache

_bearer = HTTPBearer(
    auto_error=False,
    description="A tenant's API key, or the admin key (TIERQ_ADMIN_KEY) for /v1/admin.",
)


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_validator(request: Request) -> PayloadValidator:
    validator: PayloadValidator = request.app.state.validator
    return validator


def get_listener(request: Request) -> Listener:
    listener: Listener = request.app.state.listener
    return listener


def get_tenant_cache(request: Request) -> TenantCache:
    cache: TenantCache = request.app.state.tenant_cache
    return cache


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
ValidatorDep = Annotated[PayloadValidator, Depends(get_validator)]
ListenerDep = Annotated[Listener, Depends(get_listener)]
TenantCacheDep = Annotated[TenantCache, Depends(get_tenant_cache)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _key(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return None if credentials is None else credentials.credentials


def get_principal(
    runtime: RuntimeDep, credentials: CredentialsDep, cache: TenantCacheDep,
    listener: ListenerDep,
) -> Principal:
    listener.start()  # the cache keeps tenants only while the listener hears of changes
    return authenticate(runtime, _key(credentials), cache)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_tenant(principal: PrincipalDep) -> Tenant:
    return require_tenant(principal)


def get_admin(runtime: RuntimeDep, credentials: CredentialsDep) -> Principal:
    return require_admin(runtime, _key(credentials))


TenantDep = Annotated[Tenant, Depends(get_tenant)]
AdminDep = Annotated[Principal, Depends(get_admin)]
