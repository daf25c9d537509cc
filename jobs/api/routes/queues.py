"""``/v1/queues`` (the published figures), and the probes: ``/healthz``, ``/readyz``,
``/metrics``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from jobs.admission import estimates
from jobs.api.deps import PrincipalDep, RuntimeDep, refuse_unknown_query
from jobs.api.errors import OUTAGE_RETRY_AFTER_S, error_response, error_responses
from jobs.api.queue_schemas import (
    HealthResponse,
    KindWaiting,
    PoolQueues,
    PoolView,
    QueuesResponse,
    ReadyResponse,
    TenantUsage,
    TierQueue,
    WorkerView,
)
from jobs.core.domain import Tenant
from jobs.core.pools import DEFAULT_POOL
from jobs.fleet.arrivals import read_work
from jobs.fleet.kinds import kinds_without_worker
from jobs.fleet.metrics import (
    AppMetrics,
    TierFigures,
    percentile,
    read_index_view,
    recent_waits,
)
from jobs.index.base import Arrival, LiveWorker
from jobs.process.runtime import Runtime

router = APIRouter(tags=["queues and health"], dependencies=[Depends(refuse_unknown_query)])

READY_TIMEOUT_S = 2.0


@router.get(
    "/v1/queues",
    response_model=QueuesResponse,
    summary="Each tier's queue and the pool, as they are now",
    description="The published figures. The admin key sees the fleet: every tier's queue, "
    "bound, tenant cap and recent waits, the pool and its live workers. A tenant key sees its "
    "own tier's figures, the pool, and its own usage (queued, in flight, cap, quota); never "
    "another tenant's name or counts.",
    responses=error_responses("unauthorized", "unavailable"),
)
def get_queues(principal: PrincipalDep, runtime: RuntimeDep) -> QueuesResponse:
    now = runtime.clock()
    tenant = principal.tenant
    pools: list[PoolQueues] = []
    workers: list[WorkerView] = []
    for one in runtime.every_pool():
        live = one.index.live_workers(now=now)
        workers.extend(WorkerView.of(w, now, one.pool) for w in live)
        pools.append(_pool_queues(one, tenant, live=live, now=now))
    first = pools[0]
    if tenant is None:
        return QueuesResponse(scope="fleet", tiers=first.tiers, pool=first.pool,
                              workers=workers, pools=pools)
    return QueuesResponse(scope="tenant", tiers=first.tiers, pool=first.pool,
                          usage=first.usage, pools=pools)


def _pool_queues(
    runtime: Runtime, tenant: Tenant | None, *, live: list[LiveWorker], now: float
) -> PoolQueues:
    view = read_index_view(runtime, now=now)
    waits = recent_waits(runtime, now=now)
    arrivals = read_work(runtime.index).arrivals
    pool = view.pool
    tiers = [_tier_queue(tier, waits[tier.name], arrivals.get(tier.name))
             for tier in view.tiers if tenant is None or tier.name == tenant.tier]
    spec = runtime.pools.spec(runtime.pool)
    pool_view = PoolView(
        name=runtime.pool, kinds=sorted(spec.kinds) if runtime.pool != DEFAULT_POOL else None,
        live_workers=len(live), capacity=pool.capacity, inflight=pool.inflight,
        utilisation=pool.utilisation, service_rate=pool.service_rate,
        waiting_kinds=[KindWaiting(kind=kind, queued=queued) for kind, queued
                       in kinds_without_worker(runtime, live).items()])
    if tenant is None:
        return PoolQueues(pool=pool_view, tiers=tiers)
    queued, inflight = runtime.index.tenant_counts(tenant.id)
    usage = TenantUsage(
        tenant=tenant.id, tier=tenant.tier, queued=queued, inflight=inflight,
        cap=estimates.tenant_cap(tenant, pool),
        quota=tenant.max_queued if tenant.max_queued is not None
        else pool.quotas.get(tenant.tier, 1),
    )
    return PoolQueues(pool=pool_view, tiers=tiers, usage=usage)


def _tier_queue(tier: TierFigures, waits: list[float], arrival: Arrival | None) -> TierQueue:
    arrival_rate = 0.0 if arrival is None else arrival.rate_per_s
    return TierQueue(
        name=tier.name, queued=tier.queued, bound=tier.bound, oldest_age_s=tier.oldest_age_s,
        tenant_cap=tier.tenant_cap, wait_p50_s=percentile(waits, 0.50),
        wait_p95_s=percentile(waits, 0.95), arrival_rate=round(arrival_rate, 6),
    )


@router.get("/healthz", response_model=HealthResponse, summary="200 while the process lives",
            description="Liveness: answers without touching SQL or Redis. No key.")
def healthz() -> HealthResponse:
    return HealthResponse(status="ok")


def _sql_answers(runtime: Runtime) -> None:
    with runtime.engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))


def _redis_answers(runtime: Runtime) -> None:
    runtime.redis.ping()


async def _check(probe: Callable[[Runtime], None], runtime: Runtime) -> str:
    """"ok", or why not; a probe that hangs counts as failed after ``READY_TIMEOUT_S``."""
    try:
        await asyncio.wait_for(run_in_threadpool(probe, runtime), READY_TIMEOUT_S)
    except Exception as exc:
        return f"failed: {type(exc).__name__}"
    return "ok"


@router.get(
    "/readyz",
    response_model=ReadyResponse,
    summary="200 only when SQL and Redis answer",
    description="Readiness: 200 when both SQL and Redis answer within 2 s, else 503 naming "
    "the one that does not. No key.",
    responses=error_responses("unavailable"),
)
async def readyz(runtime: RuntimeDep) -> ReadyResponse | JSONResponse:
    sql, redis_ = await asyncio.gather(
        _check(_sql_answers, runtime), _check(_redis_answers, runtime)
    )
    checks = {"sql": sql, "redis": redis_}
    if all(result == "ok" for result in checks.values()):
        return ReadyResponse(status="ready", checks=checks)
    down = ", ".join(name for name, result in checks.items() if result != "ok")
    return error_response(
        503, "unavailable", f"not ready: {down} does not answer",
        headers={"Retry-After": str(OUTAGE_RETRY_AFTER_S)},
        retry_after_seconds=OUTAGE_RETRY_AFTER_S, checks=checks,
    )


@router.get(
    "/metrics",
    summary="Prometheus text format",
    description="Queue depths, pool figures, jobs by state, waits and refusals, read "
    "fleet-wide at each scrape. No key.",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "metrics"}},
)
def metrics(request: Request) -> Response:
    app_metrics: AppMetrics = request.app.state.metrics
    return Response(app_metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
