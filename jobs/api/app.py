"""The application factory: ``create_app(settings)`` wires routes, errors and middleware.

The OpenAPI document names this deployment's tiers and job kinds (``jobs.api.openapi``);
``/docs`` and ``/redoc`` serve their assets from the ``fastapi_offline`` package, and
``/dashboard`` its own from this one (``jobs.api.routes.dashboard``), so all three work where
no CDN can be reached.

Middleware, outermost first: ``FastSubmit`` (the usual submit answered at once, everything
else passed on), ``CatchAll`` (a bug becomes a typed, logged 500), then ``BodyLimit`` (413
before parsing). A runtime built here is closed on shutdown; one passed
in belongs to the caller. The process's ``jobs.index.notify.Listener`` (started on the first
request) and its tenant cache belong to the app, and the listener stops with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool

from jobs.admission.submit import KindCatalog, PayloadValidator
from jobs.api.body_limit import BodyLimit
from jobs.api.errors import CatchAll, install_error_handlers
from jobs.api.fast_submit import FastSubmit
from jobs.api.openapi import install_openapi
from jobs.api.routes import (
    admin as routes_admin,
)
from jobs.api.routes import (
    batches as routes_batches,
)
from jobs.api.routes import (
    dashboard as routes_dashboard,
)
from jobs.api.routes import (
    documents as routes_documents,
)
from jobs.api.routes import (
    events as routes_events,
)
from jobs.api.routes import explorer as routes_explorer
from jobs.api.routes import (
    jobs as routes_jobs,
)
from jobs.api.routes import (
    queues as routes_queues,
)
from jobs.api.routes import webhooks as routes_webhooks
from jobs.api.routes import (
    workers as routes_workers,
)
from jobs.execution.registry import default_registry
from jobs.fleet.metrics import AppMetrics
from jobs.index.notify import Listener
from jobs.process.runtime import Runtime
from jobs.process.settings import Settings
from jobs.service.tenant_cache import TenantCache

DESCRIPTION = (
    "A durable, tiered job scheduler. Submit jobs, come back for the result. Every error is "
    '`{"error": {"type", "message", ...}}`; a 429 carries `Retry-After`, `X-Queue-Position` '
    "and `X-Tier`."
)


def _version() -> str:
    try:
        return version("tierq")
    except PackageNotFoundError:
        return "0"


def create_app(
    settings: Settings,
    runtime: Runtime | None = None,
    *,
    validator: PayloadValidator | None = None,
) -> FastAPI:
    """The API. ``validator`` checks payloads by kind (default: the handler registry)."""
    owned = runtime is None
    active = runtime if runtime is not None else Runtime.from_settings(settings)
    if validator is None:
        validator = default_registry()
    cache = TenantCache()
    listener = Listener(
        active.settings.resolved_redis_url(), active.settings.key_prefix,
        pools=[active.settings.pool_prefix(name) for name in active.pools.names],
        on_tenants=lambda _ids: cache.invalidate(), on_link=cache.set_live,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await run_in_threadpool(listener.stop)  # joins its thread
            if owned:
                active.close()

    # /docs (Swagger UI) and /redoc load their scripts from the installed package, not a CDN.
    app = FastAPIOffline(title="tierq", version=_version(), description=DESCRIPTION,
                         lifespan=lifespan)
    app.state.runtime = active
    app.state.validator = validator
    app.state.metrics = AppMetrics(active)
    app.state.listener = listener
    app.state.tenant_cache = cache
    routers = (routes_jobs.router, routes_events.router, routes_events.batch_router,
               routes_batches.router,
               routes_documents.router, routes_queues.router, routes_dashboard.router,
               routes_admin.router, routes_workers.router, routes_explorer.router,
               routes_webhooks.router)
    for router in routers:
        app.include_router(router)
    app.mount(routes_dashboard.ASSETS_PATH, routes_dashboard.assets(), name="dashboard-assets")
    install_error_handlers(app, [route for router in routers for route in router.routes])
    kinds = validator.kinds() if isinstance(validator, KindCatalog) else None
    install_openapi(app, tiers=sorted(active.policy.tiers), kinds=kinds)
    documents = settings.api.max_document_bytes + routes_documents.MULTIPART_OVERHEAD_BYTES
    app.add_middleware(BodyLimit, max_body_bytes=settings.api.max_body_bytes,
                       path_limits={routes_documents.router.prefix: documents,
                                    routes_batches.router.prefix:
                                    settings.api.max_batch_body_bytes})
    app.add_middleware(CatchAll)
    app.add_middleware(FastSubmit, runtime=active, validator=validator, cache=cache,
                       listener=listener, max_body_bytes=settings.api.max_body_bytes)
    return app
