"""``GET /v1/jobs/{id}/events`` and ``GET /v1/batches/{id}/events``: a job's changes, and a
batch's counts, as Server-Sent Events.

First the job as it is (``event: job``, the job's body), then one event per change: ``job``
when its status (or attempt, or a cancel request) moved, ``progress`` when its handler
reported; the stream ends after the terminal ``job`` event. Waiting costs no SQL: the
stream sleeps on the notifications long-polls use (``jobs.index.notify``), reads SQL only on
its job's status news (and every safety-net period, in case a notification was lost), and
reads a progress report from Redis alone. A comment every ``PING_S`` keeps proxies from
closing a quiet stream.

A batch's stream sends its body (``event: batch``) at once and whenever its counts moved,
woken by its items' announcements (``notify.announce_batches``: admitted, started, ended),
reading the counts at most every ``BATCH_EVERY_S``; it ends once no item is left to run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from jobs.admission import estimates
from jobs.api.batch_schemas import BatchResponse
from jobs.api.deps import ListenerDep, RuntimeDep, TenantDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.api.routes.batches import _READ as _BATCH_READ
from jobs.api.routes.batches import BatchIdPath
from jobs.api.routes.jobs import _READ, JobIdPath, _safety_net_s
from jobs.api.schemas import JobResponse, ProgressView
from jobs.core.domain import Job, Tenant
from jobs.core.errors import TierqError
from jobs.core.progress import Report
from jobs.core.states import Status
from jobs.index import notify
from jobs.index import progress as progress_index
from jobs.index.notify import CHANGED, EVERYTHING, PROGRESSED, Listener
from jobs.process.outage import REDIS_OUTAGE, SQL_OUTAGE
from jobs.process.runtime import Runtime
from jobs.service import batches
from jobs.service import jobs as job_service
from jobs.store.batches import Batch

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(refuse_unknown_query)])

# A comment line this often on a quiet stream (proxies close idle connections).
PING_S = 15.0
OUTAGE = (*REDIS_OUTAGE, *SQL_OUTAGE)
# Each event: its name, and its data (the job's body, or a progress report, as JSON text).
EVENT: dict[str, Any] = {"type": "object", "required": ["event", "data"], "properties": {
    "event": {"type": "string", "enum": ["job", "progress", "error"]},
    "data": {"type": "string", "contentMediaType": "application/json"}}}
STREAM = {"text/event-stream": {"schema": EVENT, "example": (
    'event: job\ndata: {"id": "…", "status": "running", …}\n\n'
    'event: progress\ndata: {"fraction": 0.4, "message": "chunk 40 of 100", "at": "…"}\n\n')}}


@router.get(
    "/{job_id}/events",
    summary="A job's changes as Server-Sent Events, until it ends",
    description="text/event-stream: first `event: job` with the job's body, then `event: "
    "job` on each change of its status and `event: progress` on each report of its "
    "handler; the stream ends after the terminal `job` event. Waiting costs no SQL.",
    responses={200: {"content": STREAM, "description": "the job's events"},
               **error_responses(*_READ)},
)
async def job_events(
    job_id: JobIdPath, tenant: TenantDep, runtime: RuntimeDep, listener: ListenerDep,
) -> EventSourceResponse:
    job = await run_in_threadpool(job_service.load_job, runtime, tenant, job_id)  # 404 here
    stream = _ended_on_error(_events(runtime, listener, tenant, job))
    return EventSourceResponse(stream, ping=PING_S, headers={"Cache-Control": "no-store"})


async def _ended_on_error(
    events: AsyncIterator[dict[str, str]]
) -> AsyncIterator[dict[str, str]]:
    """A stream that cannot go on (its job pruned meanwhile, SQL or Redis gone) ends with an
    ``error`` event carrying the typed error, instead of a connection cut mid-stream."""
    try:
        async for event in events:
            yield event
    except TierqError as exc:
        yield _error_event(exc.type, exc.message)
    except OUTAGE as exc:
        yield _error_event("unavailable", f"the stream cannot go on: {type(exc).__name__}; "
                                          "reconnect, or read the resource again")


def _error_event(kind: str, message: str) -> dict[str, str]:
    return {"event": "error", "data": json.dumps({"type": kind, "message": message})}


async def _events(
    runtime: Runtime, listener: Listener, tenant: Tenant, job: Job
) -> AsyncIterator[dict[str, str]]:
    listener.start()
    waiter = listener.waiters.add(job.id, asyncio.get_running_loop(), EVERYTHING)
    try:
        # Read again now that the waiter is in place: a change committed after this read
        # rings it, so none falls between the first read and the registration.
        job = await run_in_threadpool(job_service.load_job, runtime, tenant, job.id)
        body, report = await _body(runtime, tenant, job)
        yield {"event": "job", "data": body.model_dump_json()}
        seen = None if report is None else report.at
        safety_at = time.monotonic() + _safety_net_s()
        while not job.terminal:
            rung = await waiter.wait(max(0.0, safety_at - time.monotonic()))
            if CHANGED in rung or time.monotonic() >= safety_at:
                fresh = await run_in_threadpool(job_service.load_job, runtime, tenant, job.id)
                safety_at = time.monotonic() + _safety_net_s()
                if _moved(job, fresh):
                    job = fresh
                    body, report = await _body(runtime, tenant, job)
                    yield {"event": "job", "data": body.model_dump_json()}
                    seen = seen if report is None else max(report.at, seen or report.at)
                    continue
            if PROGRESSED in rung and job.status is Status.RUNNING:
                report = await run_in_threadpool(_report, runtime, job)
                if report is not None and (seen is None or report.at > seen):
                    seen = report.at
                    view = ProgressView.of(report)
                    assert view is not None
                    yield {"event": "progress", "data": view.model_dump_json()}
    finally:
        listener.waiters.discard(waiter)


async def _body(
    runtime: Runtime, tenant: Tenant, job: Job
) -> tuple[JobResponse, Report | None]:
    progress = await run_in_threadpool(estimates.progress, runtime, tenant, job)
    return JobResponse.of(progress), progress.report


def _report(runtime: Runtime, job: Job) -> Report | None:
    pool = runtime.for_kind(job.kind)
    return progress_index.read(runtime.redis, pool.prefix, {job.id: job.attempt}).get(job.id)


def _moved(before: Job, after: Job) -> bool:
    return ((before.status, before.attempt, before.cancel_requested)
            != (after.status, after.attempt, after.cancel_requested))



batch_router = APIRouter(prefix="/v1/batches", tags=["batches"],
                         dependencies=[Depends(refuse_unknown_query)])
# A batch stream reads its counts at most this often, however fast its items move.
BATCH_EVERY_S = 0.5
BATCH_STREAM = {"text/event-stream": {"schema": {**EVENT, "properties": {
    **EVENT["properties"], "event": {"type": "string", "enum": ["batch", "error"]}}},
    "example": 'event: batch\ndata: {"id": "…", "status": "running", "counts": {…}, …}\n\n'}}


@batch_router.get(
    "/{batch_id}/events",
    summary="A batch's counts as Server-Sent Events, until it is finished",
    description="text/event-stream: `event: batch` with the batch's body (as GET "
    "/v1/batches/{batch_id}) at once and on each change of its counts, at most twice a "
    "second; the stream ends once no item is left to run. Waiting costs no SQL.",
    responses={200: {"content": BATCH_STREAM, "description": "the batch's events"},
               **error_responses(*_BATCH_READ)},
)
async def batch_events(
    batch_id: BatchIdPath, tenant: TenantDep, runtime: RuntimeDep, listener: ListenerDep,
) -> EventSourceResponse:
    batch = await run_in_threadpool(batches.load, runtime, tenant, batch_id)  # 404 here
    stream = _ended_on_error(_batch_events(runtime, listener, batch))
    return EventSourceResponse(stream, ping=PING_S, headers={"Cache-Control": "no-store"})


async def _batch_events(
    runtime: Runtime, listener: Listener, batch: Batch
) -> AsyncIterator[dict[str, str]]:
    listener.start()
    waiter = listener.waiters.add(notify.batch_topic(batch.id), asyncio.get_running_loop())
    try:
        last = None
        while True:
            progress = await run_in_threadpool(batches.progress, runtime, batch)
            body = BatchResponse.of(progress).model_dump_json()
            if body != last:
                last = body
                yield {"event": "batch", "data": body}
            if not any(n and not Status(name).terminal for name, n in progress.counts.items()):
                return  # no item is left to run
            await waiter.wait(_safety_net_s())
            await asyncio.sleep(BATCH_EVERY_S)  # the news of many items, read once
    finally:
        listener.waiters.discard(waiter)
