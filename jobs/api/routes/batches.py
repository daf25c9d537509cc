"""``/v1/batches``: submit (JSON or streamed NDJSON), look up, list, stream results, cancel.

A JSON batch is parsed whole (its items must be validated before anything is stored); an
NDJSON batch is read line by line as it arrives: the service, in the threadpool, pulls the
body's chunks from the event loop, validates each item and inserts it in chunks within the
batch's one transaction, so only a chunk of rows is held at once. Batch bodies have their own
size limit, ``api.max_batch_body_bytes`` (``jobs.api.body_limit``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import anyio.from_thread
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from jobs.api.batch_schemas import (
    BatchListResponse,
    BatchRequest,
    BatchResponse,
    BatchSubmitResponse,
)
from jobs.api.deps import RuntimeDep, TenantDep, ValidatorDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.api.schemas import MAX_ATTEMPTS_LIMIT
from jobs.core.errors import InvalidRequest
from jobs.service import batches

router = APIRouter(prefix="/v1/batches", tags=["batches"],
                   dependencies=[Depends(refuse_unknown_query)])

NDJSON = "application/x-ndjson"
_READ = ("invalid_request", "unauthorized", "forbidden", "not_found", "unavailable")
BatchIdPath = Annotated[str, Path(description="the batch's id, from the submit's answer")]

_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": BatchRequest.model_json_schema()},
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
    "by the tenant's limit on open batches (429 tenant_limit, limit batches). As "
    "JSON (`kind`, `items`) or as NDJSON (one payload per line, `?kind=`).",
    openapi_extra={"requestBody": _BODY},
    responses={
        200: {"model": BatchSubmitResponse,
              "description": "this idempotency key was used before for the same kind and "
                             "items: the same batch"},
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
) -> BatchSubmitResponse:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == NDJSON:
        if kind is None:
            raise InvalidRequest("an NDJSON batch names its kind: ?kind=<kind>",
                                 details=[{"loc": ["query", "kind"], "msg": "required"}])
        spec = batches.BatchSpec(kind=kind, idempotency_key=idempotency_key,
                                 max_attempts=max_attempts)
        chunks = request.stream()
        submitted = await run_in_threadpool(
            lambda: batches.submit(runtime, validator, tenant, spec, _ndjson(chunks)))
    else:
        if kind is not None or idempotency_key is not None or max_attempts is not None:
            raise InvalidRequest("a JSON batch carries kind, idempotency_key and max_attempts "
                                 "in its body, not the query")
        body = _json_batch(content_type, await request.body())
        spec = batches.BatchSpec(kind=body.kind, idempotency_key=body.idempotency_key,
                                 max_attempts=body.max_attempts)
        submitted = await run_in_threadpool(
            lambda: batches.submit(runtime, validator, tenant, spec, body.items))
    response.headers["Location"] = f"/v1/batches/{submitted.batch.id}"
    if not submitted.created:
        response.status_code = 200
    return BatchSubmitResponse.of(submitted.batch)


def _json_batch(content_type: str, raw: bytes) -> BatchRequest:
    if content_type not in ("application/json", ""):
        raise InvalidRequest(f"send the batch as application/json or {NDJSON}, "
                             f"not {content_type!r}")
    try:
        return BatchRequest.model_validate_json(raw or b"null")
    except ValidationError as exc:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]) from None


def _ndjson(chunks: AsyncIterator[bytes]) -> Iterator[Any]:
    """The body's lines as parsed JSON, pulled from the event loop as they arrive (runs in a
    worker thread). A line that is not JSON is a 422 naming its index."""

    async def next_chunk() -> bytes | None:
        try:
            return await chunks.__anext__()
        except StopAsyncIteration:
            return None

    pending, index = b"", 0
    while True:
        chunk = anyio.from_thread.run(next_chunk)
        if chunk is None:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                yield _parse_line(line, index)
                index += 1
    if pending.strip():
        yield _parse_line(pending, index)


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
    "(or `error`), streamed; `?after=<index>` resumes after that index.",
    response_class=StreamingResponse,
    responses={200: {"content": {NDJSON: {"schema": {"type": "string"}}},
                     "description": "one JSON object per line"},
               **error_responses(*_READ)},
)
def batch_results(
    batch_id: BatchIdPath,
    tenant: TenantDep,
    runtime: RuntimeDep,
    after: Annotated[int, Query(ge=-1, le=batches.MAX_BATCH_ITEMS,
                                description="only items past this index")] = -1,
) -> StreamingResponse:
    batch = batches.load(runtime, tenant, batch_id)
    lines = batches.results(runtime, batch, after=after)
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
