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

from jobs.api.deps import PrincipalDep, RuntimeDep, refuse_unknown_query
from jobs.api.errors import OUTAGE_RETRY_AFTER_S, error_response, error_responses
from jobs.api.schemas import (
    HealthResponse,
    PoolView,
    QueuesResponse,
    ReadyResponse,
    TierQueue,
)
from jobs.metrics import AppMetrics, percentile, read_index_view, recent_waits
from jobs.runtime import Runtime

router = APIRouter(tags=["queues and health"], dependencies=[Depends(refuse_unknown_query)])

READY_TIMEOUT_S = 2.0


@router.get(
    "/v1/queues",
    response_model=QueuesResponse,
    summary="Each tier's queue and the pool, as they are now",
    description="The published figures, fleet-wide: each tier's queue, bound, tenant cap and "
    "recent waits, and the pool's capacity and service rate. Any valid key.",
    responses=error_responses("unauthorized", "unavailable"),
)
def get_queues(_: PrincipalDep, runtime: RuntimeDep) -> QueuesResponse:
    now = runtime.clock()
    view = read_index_view(runtime, now=now)
    waits = recent_waits(runtime, now=now)
    pool = view.pool
    return QueuesResponse(
        tiers=[
            TierQueue(
                name=tier.name,
                queued=tier.queued,
                bound=tier.bound,
                oldest_age_s=tier.oldest_age_s,
                tenant_cap=tier.tenant_cap,
                wait_p50_s=percentile(waits[tier.name], 0.50),
                wait_p95_s=percentile(waits[tier.name], 0.95),
            )
            for tier in view.tiers
        ],
        pool=PoolView(
            capacity=pool.capacity,
            inflight=pool.inflight,
            utilisation=pool.utilisation,
            service_rate=pool.service_rate,
        ),
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
