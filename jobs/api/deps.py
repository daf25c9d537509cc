"""Dependencies of the route handlers, as ``Annotated`` aliases.

``RuntimeDep`` (connections and policy), ``ValidatorDep`` (the handler registry that checks
payloads), ``TenantDep`` (a tenant key's tenant), ``AdminDep`` (the admin key),
``PrincipalDep`` (either), ``ListenerDep`` (this process's ``jobs.index.notify.Listener``) and
``TenantCacheDep`` (its ``jobs.service.tenant_cache.TenantCache``). Those that do no I/O are
``async``, so a request pays no threadpool hop for them; a key not in the cache is looked up
in SQL on the threadpool.

``refuse_unknown_query`` is every router's own dependency: a query parameter the route does
not take is a 422, as an unknown body field is, so ``?limt=10`` is an error rather than a
silently ignored option.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from jobs.admission.submit import PayloadValidator
from jobs.api.auth import (
    Principal,
    authenticate,
    known_principal,
    require_admin,
    require_tenant,
)
from jobs.blobs.store import BlobStore
from jobs.core.domain import Tenant
from jobs.core.errors import InvalidRequest
from jobs.index.notify import Listener
from jobs.process.runtime import Runtime
from jobs.service.tenant_cache import TenantCache

_bearer = HTTPBearer(
    auto_error=False,
    description="A tenant's API key, or the admin key (TIERQ_ADMIN_KEY) for /v1/admin.",
)


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def get_validator(request: Request) -> PayloadValidator:
    validator: PayloadValidator = request.app.state.validator
    return validator


async def get_listener(request: Request) -> Listener:
    listener: Listener = request.app.state.listener
    return listener


async def get_tenant_cache(request: Request) -> TenantCache:
    cache: TenantCache = request.app.state.tenant_cache
    return cache


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def blob_store(request: Request, runtime: RuntimeDep) -> BlobStore:
    """The app's blob store, built on first use from the runtime's settings."""
    store: BlobStore | None = getattr(request.app.state, "blob_store", None)
    if store is None:
        store = request.app.state.blob_store = BlobStore.from_settings(runtime.settings)
    return store


BlobStoreDep = Annotated[BlobStore, Depends(blob_store)]
ValidatorDep = Annotated[PayloadValidator, Depends(get_validator)]
ListenerDep = Annotated[Listener, Depends(get_listener)]
TenantCacheDep = Annotated[TenantCache, Depends(get_tenant_cache)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _key(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return None if credentials is None else credentials.credentials


async def get_principal(
    runtime: RuntimeDep, credentials: CredentialsDep, cache: TenantCacheDep,
    listener: ListenerDep,
) -> Principal:
    """The caller, on the event loop when its key is the admin's or cached (no I/O), else
    looked up in SQL on the threadpool."""
    listener.start()  # the cache keeps tenants only while the listener hears of changes
    key = _key(credentials)
    known = known_principal(runtime, key, cache)
    if known is not None:
        return known
    return await run_in_threadpool(authenticate, runtime, key, cache)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def get_tenant(principal: PrincipalDep) -> Tenant:
    return require_tenant(principal)


def get_admin(runtime: RuntimeDep, credentials: CredentialsDep) -> Principal:
    return require_admin(runtime, _key(credentials))


TenantDep = Annotated[Tenant, Depends(get_tenant)]
AdminDep = Annotated[Principal, Depends(get_admin)]


_QUERY_NAMES: dict[int, frozenset[str]] = {}  # by id(route): routes live as long as the app


async def refuse_unknown_query(request: Request) -> None:
    if not request.query_params:
        return  # the hot path (a submit) has none: nothing to look up
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known = _QUERY_NAMES.get(id(route))
    if known is None:
        known = _QUERY_NAMES[id(route)] = frozenset(_query_names(route.dependant))
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        allowed = ", ".join(sorted(known)) or "none"
        raise InvalidRequest(
            f"unknown query parameter {unknown[0]!r} (this route takes: {allowed})",
            details=[{"loc": ["query", name], "msg": "unknown query parameter"}
                     for name in unknown],
        )


def _query_names(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names
