"""``/v1/batches``: submit (JSON or streamed NDJSON), look up, list, stream results, cancel.

A batch's body is read whole, and every item validated, before anything is written; then the
service stores it in one short transaction. The bytes are awaited on the event loop, so a
client that sends slowly, or stalls, holds no thread and no write lock (on SQLite the lock of
the whole database): an NDJSON body is split into lines as it arrives and each arrived chunk
of lines is parsed and validated in the threadpool, a bad line refused (422 naming its index)
before the rest is sent; a JSON body is parsed and validated whole once it is in. The
validated items are held as compact JSON, bounded by the batch body size limit,
``api.max_batch_body_bytes`` (``jobs.api.body_limit``).

A body that has not arrived within ``api.batch_body_timeout_s`` is a 408 (``invalid_request``;
nothing stored), and a tenant may have ``api.max_concurrent_uploads_per_tenant`` uploads in
flight in this process (one more is ``429 tenant_limit``, ``limit: "uploads"``): one tenant's
stalled uploads cannot take the process from the others. The count is this process's own,
kept on its event loop; each API process bounds what it holds.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Iterator
from typing import Annotated, Any, Literal, TypeVar

import anyio
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from jobs.admission.submit import PayloadValidator
from jobs.api.batch_schemas import (
    ENVELOPE,
    MAX_WINDOW_S,
    WINDOW,
    BatchListResponse,
    BatchRequest,
    BatchResponse,
    BatchSubmitResponse,
)
from jobs.api.deps import RuntimeDep, TenantDep, ValidatorDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.api.schemas import MAX_ATTEMPTS_LIMIT, TIMEOUT, ErrorResponse
from jobs.api.webhook_schemas import webhook_of_fields
from jobs.core.domain import Tenant
from jobs.core.errors import InvalidRequest, TenantLimitExceeded
from jobs.core.policy import MAX_TIMEOUT_S
from jobs.core.webhooks import MAX_URL_LENGTH
from jobs.process.runtime import Runtime
from jobs.service import batches
from jobs.service.batch_items import MAX_BATCH_ITEMS, ValidatedItems

router = APIRouter(prefix="/v1/batches", tags=["batches"],
                   dependencies=[Depends(refuse_unknown_query)])

NDJSON = "application/x-ndjson"
_READ = ("invalid_request", "unauthorized", "forbidden", "not_found", "unavailable")
BatchIdPath = Annotated[str, Path(description="the batch's id, from the submit's answer")]
# Retry-After of a refusal for too many uploads in flight: one of them has to end first.
UPLOADS_RETRY_S = 5
T = TypeVar("T")

def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its ``$defs`` put in place of their references: the body
    is declared by hand, so nothing else would carry the definitions it points to."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return resolve({**defs[ref.removeprefix("#/$defs/")],
                                **{k: v for k, v in node.items() if k != "$ref"}})
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": _inlined(BatchRequest.model_json_schema())},
        NDJSON: {"schema": {"type": "string", "description": "one item payload (a JSON "
                                                             "object) per line; ?kind= names "
                                                             "the kind"}},
    },
}


@router.post(
    "",
    status_code=202,
    response_model=BatchSubmitResponse,
    summary="Submit a batch",
    description="Validate every item (a bad one: 422 naming its index, nothing stored), store "
    "them all in one transaction, and answer 202 at once. The items enter the tier's live "
    "queue as room allows, ageing from then; they are never refused by the tier's bound, only "
    "by the tenant's limits on open batches and on uploads in flight (429 tenant_limit, "
    "limit batches or uploads). As JSON (`kind`, `items`) or as NDJSON (one payload per "
    "line, `?kind=`). The whole body arrives within api.batch_body_timeout_s, or it is a "
    "408 invalid_request and nothing is stored.",
    openapi_extra={"requestBody": _BODY},
    responses={
        200: {"model": BatchSubmitResponse,
              "description": "this idempotency key was used before for the same kind and "
                             "items: the same batch"},
        408: {"model": ErrorResponse,
              "description": "`invalid_request`: the body did not arrive within "
                             "api.batch_body_timeout_s; nothing was stored"},
        202: {"description": "stored; its items wait for room",
              "headers": {"Location": {"description": "/v1/batches/<id>",
                                       "schema": {"type": "string"}}}},
        **error_responses("invalid_request", "unauthorized", "forbidden",
                          "idempotency_conflict", "payload_too_large", "tenant_limit",
                          "unavailable"),
    },
)
async def submit_batch(
    request: Request,
    tenant: TenantDep,
    runtime: RuntimeDep,
    validator: ValidatorDep,
    response: Response,
    kind: Annotated[str | None, Query(min_length=1, max_length=100,
                                      description="NDJSON bodies: the items' kind")] = None,
    idempotency_key: Annotated[str | None, Query(
        min_length=1, max_length=200, description="NDJSON bodies: the batch's key")] = None,
    max_attempts: Annotated[int | None, Query(
        ge=1, le=MAX_ATTEMPTS_LIMIT, description="NDJSON bodies: starts allowed per item")
    ] = None,
    timeout_s: Annotated[float | None, Query(
        gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False,
        description=f"NDJSON bodies: each item's run-time limit, {TIMEOUT}")] = None,
    envelope: Annotated[bool | None, Query(description=f"NDJSON bodies: {ENVELOPE}")] = None,
    completion_window_s: Annotated[float | None, Query(
        gt=0, le=MAX_WINDOW_S, allow_inf_nan=False,
        description=f"NDJSON bodies: {WINDOW}")] = None,
    webhook_url: Annotated[str | None, Query(
        min_length=1, max_length=MAX_URL_LENGTH,
        description="NDJSON bodies: the batch's webhook (docs/api.md, Webhooks)")] = None,
    webhook_events: Annotated[str | None, Query(
        max_length=100, description="NDJSON bodies: its events, comma-separated: completed, "
        "item.completed (default: completed)")] = None,
) -> BatchSubmitResponse:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    api = runtime.settings.api
    if content_type == NDJSON:
        if kind is None:
            raise InvalidRequest("an NDJSON batch names its kind: ?kind=<kind>",
                                 details=[{"loc": ["query", "kind"], "msg": "required"}])
        spec = batches.BatchSpec(kind=kind, idempotency_key=idempotency_key,
                                 max_attempts=max_attempts, timeout_s=timeout_s,
                                 envelope=bool(envelope),
                                 completion_window_s=completion_window_s,
                                 webhook=webhook_of_fields(webhook_url, webhook_events,
                                                           where="query"))
        with _uploads(request).slot(tenant, api.max_concurrent_uploads_per_tenant):
            await run_in_threadpool(batches.check_submittable, runtime, tenant, spec)
            items = ValidatedItems(validator, kind, envelope=spec.envelope)
            await _within(api.batch_body_timeout_s, _read_ndjson(request, items))
            submitted = await run_in_threadpool(batches.store, runtime, tenant, spec, items)
    else:
        if (kind is not None or idempotency_key is not None or max_attempts is not None
                or timeout_s is not None or envelope is not None
                or completion_window_s is not None or webhook_url is not None
                or webhook_events is not None):
            raise InvalidRequest("a JSON batch carries kind, idempotency_key, max_attempts, "
                                 "timeout_s, envelope, completion_window_s and webhook in "
                                 "its body, not the query")
        if content_type not in ("application/json", ""):
            raise InvalidRequest(f"send the batch as application/json or {NDJSON}, "
                                 f"not {content_type!r}")
        with _uploads(request).slot(tenant, api.max_concurrent_uploads_per_tenant):
            raw = await _within(api.batch_body_timeout_s, _body(request))
            submitted = await run_in_threadpool(_submit_json, runtime, validator, tenant, raw)
    response.headers["Location"] = f"/v1/batches/{submitted.batch.id}"
    if not submitted.created:
        response.status_code = 200
    return BatchSubmitResponse.of(submitted.batch)


class _Uploads:
    """The batch uploads in flight in this process, by tenant. Counted on the event loop
    (every change happens between two awaits), so it needs no lock."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    @contextlib.contextmanager
    def slot(self, tenant: Tenant, limit: int) -> Iterator[None]:
        held = self._held.get(tenant.id, 0)
        if held >= limit:
            raise TenantLimitExceeded(
                f"tenant {tenant.name!r} has {held} batch uploads in flight, the most it may "
                f"have at once; send this one when one of them has ended",
                tier=tenant.tier, retry_after_s=UPLOADS_RETRY_S, queue_position=0,
                limit="uploads", uploads=held, max_concurrent_uploads=limit,
            )
        self._held[tenant.id] = held + 1
        try:
            yield
        finally:
            left = self._held[tenant.id] - 1
            if left:
                self._held[tenant.id] = left
            else:
                del self._held[tenant.id]


def _uploads(request: Request) -> _Uploads:
    uploads: _Uploads | None = getattr(request.app.state, "batch_uploads", None)
    if uploads is None:
        uploads = request.app.state.batch_uploads = _Uploads()
    return uploads


async def _within(timeout_s: float, reading: Awaitable[T]) -> T:
    """``reading``'s value, or a 408 once ``timeout_s`` has passed: the client had that long
    to send its body. The connection is closed after the answer (the rest of the body was
    never read)."""
    with anyio.move_on_after(timeout_s):
        return await reading
    raise HTTPException(408, f"the batch body did not arrive within {timeout_s:g} s "
                             f"(api.batch_body_timeout_s); nothing was stored",
                        headers={"Connection": "close"})


async def _body(request: Request) -> bytes:
    try:
        return await request.body()
    except ClientDisconnect:
        raise _left() from None


def _left() -> InvalidRequest:
    """The client went away mid-body: nobody reads this answer, but it is a typed one."""
    return InvalidRequest("the client closed the connection before its batch body ended; "
                          "nothing was stored")


async def _read_ndjson(request: Request, items: ValidatedItems) -> None:
    """Add the body's lines to ``items`` as they arrive: each chunk's whole lines are parsed
    and validated in the threadpool (no loop time spent on them), the bytes awaited here."""
    lines = _Lines()
    try:
        async for chunk in request.stream():
            complete = lines.feed(chunk)
            if complete:
                await run_in_threadpool(_add_lines, items, complete)
    except ClientDisconnect:
        raise _left() from None
    await run_in_threadpool(_add_lines, items, [lines.rest()])


class _Lines:
    """Split a stream of chunks into lines; a line's parts are joined once, when it ends."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        *complete, tail = chunk.split(b"\n")
        if not complete:
            self._parts.append(tail)
            return []
        complete[0] = b"".join([*self._parts, complete[0]])
        self._parts = [tail]
        return complete

    def rest(self) -> bytes:
        return b"".join(self._parts)


def _add_lines(items: ValidatedItems, lines: list[bytes]) -> None:
    for line in lines:
        if line.strip():
            items.add(_parse_line(line, len(items)))


def _submit_json(runtime: Runtime, validator: PayloadValidator, tenant: Tenant, raw: bytes
                 ) -> batches.SubmittedBatch:
    body = _json_batch(raw)
    spec = batches.BatchSpec(kind=body.kind, idempotency_key=body.idempotency_key,
                             max_attempts=body.max_attempts, timeout_s=body.timeout_s,
                             envelope=body.envelope,
                             completion_window_s=body.completion_window_s,
                             webhook=None if body.webhook is None else body.webhook.webhook())
    return batches.submit(runtime, validator, tenant, spec, body.items)


def _json_batch(raw: bytes) -> BatchRequest:
    try:
        return BatchRequest.model_validate_json(raw or b"null")
    except ValidationError as exc:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]) from None


def _parse_line(line: bytes, index: int) -> Any:
    """One item; a line nested too deep for the parser (RecursionError) is bad input too,
    refused as a JSON body of the same value is, never a 500."""
    try:
        return json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidRequest(f"items[{index}]: the line is not valid JSON; nothing was stored",
                             index=index, details=[{"loc": ["items", index],
                                                    "msg": "not valid JSON"}]) from None


@router.get(
    "",
    response_model=BatchListResponse,
    summary="This tenant's batches, newest first",
    description="Each with its items counted by state.",
    responses=error_responses("invalid_request", "unauthorized", "forbidden", "unavailable"),
)
def list_batches(
    tenant: TenantDep,
    runtime: RuntimeDep,
    limit: Annotated[int, Query(ge=1, le=batches.MAX_LIST, description="batches")] = 50,
) -> BatchListResponse:
    found = batches.list_batches(runtime, tenant, limit=limit)
    return BatchListResponse(batches=[BatchResponse.of(progress) for progress in found])


@router.get(
    "/{batch_id}",
    response_model=BatchResponse,
    summary="A batch's progress",
    description="Its items counted by state, and an estimate of when the last one finishes.",
    responses=error_responses(*_READ),
)
def get_batch(batch_id: BatchIdPath, tenant: TenantDep, runtime: RuntimeDep) -> BatchResponse:
    batch = batches.load(runtime, tenant, batch_id)
    return BatchResponse.of(batches.progress(runtime, batch))


@router.get(
    "/{batch_id}/results",
    summary="A batch's finished items, as NDJSON",
    description="One line per finished item in index order: `{index, job_id, status, result}` "
    "(or `error`; `custom_id` for an envelope's item), streamed; `?after=<index>` resumes "
    "after that index; `?status=failed` keeps the items that did not succeed.",
    response_class=StreamingResponse,
    responses={200: {"content": {NDJSON: {"schema": {"type": "string"}}},
                     "description": "one JSON object per line"},
               **error_responses(*_READ)},
)
def batch_results(
    batch_id: BatchIdPath,
    tenant: TenantDep,
    runtime: RuntimeDep,
    after: Annotated[int, Query(ge=-1, le=MAX_BATCH_ITEMS,
                                description="only items past this index")] = -1,
    status: Annotated[Literal["failed"] | None, Query(
        description="failed: only the items that did not succeed (failed, cancelled, "
                    "expired): an error file")] = None,
) -> StreamingResponse:
    batch = batches.load(runtime, tenant, batch_id)
    lines = batches.results(runtime, batch, after=after, failed_only=status == "failed")
    return StreamingResponse(iterate_in_threadpool(lines), media_type=NDJSON)


@router.post(
    "/{batch_id}/cancel",
    response_model=BatchResponse,
    summary="Cancel a batch",
    description="Every item not yet started is cancelled; running ones are asked to stop.",
    responses=error_responses(*_READ),
)
def cancel_batch(batch_id: BatchIdPath, tenant: TenantDep, runtime: RuntimeDep) -> BatchResponse:
    batch = batches.load(runtime, tenant, batch_id)
    return BatchResponse.of(batches.cancel(runtime, tenant, batch))
