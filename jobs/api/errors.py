"""One error format for every answer that is not a success (docs/api.md, "Errors").

``{"error": {"type": ..., "message": ..., ...details}}``, whatever went wrong: a ``TierqError``
from the service layer, a request FastAPI could not parse, an unknown route, a backend that
cannot be reached (503 with ``Retry-After``), or a bug (500, logged, no traceback in the
body). ``ERROR_TYPES`` lists every ``type`` an answer can carry; ``error_responses`` declares
a route's error answers by type in the OpenAPI schema, with the same body and headers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy.exc as sa_exc
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobs.api.schemas import ErrorResponse
from jobs.core.errors import Refused, TierqError, Unauthorized, Unavailable
from jobs.process.outage import REDIS_OUTAGE, is_backend_outage

logger = logging.getLogger(__name__)

OUTAGE_RETRY_AFTER_S = 2
_TYPE_BY_STATUS = {
    400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "invalid_request", 413: "payload_too_large", 422: "invalid_request",
    503: "unavailable",
}  # any other 4xx Starlette raises is invalid_request too; a 5xx, internal


def error_response(
    status: int,
    type_: str,
    message: str,
    *,
    headers: Mapping[str, str] | None = None,
    **details: Any,
) -> JSONResponse:
    extra = {k: v for k, v in details.items() if k not in ("type", "message")}
    try:
        encoded = jsonable_encoder(extra)
    except (TypeError, ValueError):
        encoded = {k: str(v) for k, v in extra.items()}
    body = {"error": {"type": type_, "message": message, **encoded}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _tierq_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TierqError)
    if exc.status < 400 or (exc.status >= 500 and not isinstance(exc, Unavailable)):
        return _internal(request, exc)  # an internal signal leaked this far: a bug
    headers: dict[str, str] = {}
    details = dict(exc.details)
    if isinstance(exc, Refused):
        headers = {
            "Retry-After": str(exc.retry_after_s),
            "X-Queue-Position": str(exc.queue_position),
            "X-Tier": exc.tier,
        }
        details.update(
            tier=exc.tier,
            queue_position=exc.queue_position,
            retry_after_seconds=exc.retry_after_s,
        )
        metrics = getattr(request.app.state, "metrics", None)
        if metrics is not None:
            metrics.count_refusal(tier=exc.tier, cause=exc.type,
                                  limit=str(exc.details.get("limit", "")))
    elif isinstance(exc, Unavailable):
        headers = {"Retry-After": str(exc.retry_after_s)}
        details["retry_after_seconds"] = exc.retry_after_s
    elif isinstance(exc, Unauthorized):
        headers = {"WWW-Authenticate": "Bearer"}
    return error_response(exc.status, exc.type, exc.message, headers=headers, **details)


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(err.get("type") == "json_invalid" for err in errors):
        return error_response(
            400, "invalid_request", "the request body is not valid JSON",
            details=[{"loc": ["body"], "msg": str(err.get("ctx", {}).get("error", "invalid"))}
                     for err in errors[:1]],
        )
    details = [
        {"loc": [str(part) for part in err.get("loc", ())], "msg": str(err.get("msg", "")),
         "type": str(err.get("type", ""))}
        for err in errors
    ]
    first = details[0] if details else {"loc": [], "msg": "invalid request"}
    message = f"{'.'.join(first['loc']) or 'request'}: {first['msg']}"
    if len(details) > 1:
        message += f" (and {len(details) - 1} more)"
    content_type = request.headers.get("content-type", "")
    if first["loc"] == ["body"] and "json" not in content_type.lower():
        message = "send the body as JSON, with 'Content-Type: application/json'"
    return error_response(422, "invalid_request", message, details=details)


def _http_error_handler(routes: Sequence[BaseRoute]) -> Callable[[Request, Exception],
                                                                 JSONResponse]:
    """Starlette's own errors (no route, wrong method, unparsable body) in our format.
    A 405's ``Allow`` lists every method served at the path (Starlette names one route's)."""
    table = [
        (route.path_regex, frozenset(route.methods or ()))
        for route in routes
        if isinstance(route, APIRoute)
    ]

    def handle(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        headers = dict(exc.headers or {})
        if status == 404:
            message = f"no route {request.method} {request.url.path}"
        elif status == 405:
            path = request.scope["path"]
            methods = {m for regex, ms in table if regex.match(path) for m in ms}
            headers = {"Allow": ", ".join(sorted(methods))} if methods else headers
            allowed = ", ".join(sorted(methods)) or "none"
            message = f"method {request.method} is not allowed here (allowed: {allowed})"
        elif status == 400:
            message = "the request body could not be parsed"
        else:
            message = str(exc.detail)
        type_ = _TYPE_BY_STATUS.get(status, "invalid_request" if status < 500 else "internal")
        return error_response(status, type_, message, headers=headers)

    return handle


def _backend_error(request: Request, exc: Exception) -> JSONResponse:
    if is_backend_outage(exc):
        what = "Redis" if isinstance(exc, REDIS_OUTAGE) else "the database"
        logger.warning("api.backend_unavailable", extra={
            "event": "api.backend_unavailable", "backend": what, "error": type(exc).__name__})
        return error_response(
            503, "unavailable", f"{what} cannot be reached; nothing was accepted",
            headers={"Retry-After": str(OUTAGE_RETRY_AFTER_S)},
            retry_after_seconds=OUTAGE_RETRY_AFTER_S,
        )
    if isinstance(exc, sa_exc.DataError):
        return error_response(422, "invalid_request", "the database refused a value of this "
                              "request")
    return _internal(request, exc)


def _internal(request: Request, exc: BaseException) -> JSONResponse:
    logger.error("api.internal_error", exc_info=exc, extra={
        "event": "api.internal_error", "method": request.method, "path": request.url.path})
    return error_response(500, "internal", "an unexpected error occurred; it has been logged")


def response_for(request: Request, exc: Exception) -> JSONResponse:
    """The answer to an exception raised by a service call, as the handlers below (and
    ``CatchAll``, for anything they do not take) give it: for a route answered outside
    FastAPI's routing (``jobs.api.fast_submit``)."""
    if isinstance(exc, TierqError):
        return _tierq_error(request, exc)
    if isinstance(exc, (sa_exc.DBAPIError, sa_exc.TimeoutError, *REDIS_OUTAGE)):
        return _backend_error(request, exc)
    return _internal(request, exc)


def install_error_handlers(app: FastAPI, routes: Sequence[BaseRoute]) -> None:
    """Map every error to the one format; ``routes``: the API's routes (for ``Allow``)."""
    app.add_exception_handler(TierqError, _tierq_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler(routes))
    for exc_class in (sa_exc.DBAPIError, sa_exc.TimeoutError, *REDIS_OUTAGE):
        app.add_exception_handler(exc_class, _backend_error)


class CatchAll:
    """Outermost middleware: any exception no handler took becomes a typed 500, logged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise  # half an answer is out: let the server end the connection
            response = _internal(Request(scope), exc)
            await response(scope, receive, send)


@dataclass(frozen=True)
class ErrorType:
    """One ``type`` of error body: the statuses it comes with, and when (for the schema)."""

    statuses: tuple[int, ...]
    when: str


# Every ``type`` an error body can carry (docs/api.md lists the same, a test holds them equal).
ERROR_TYPES: dict[str, ErrorType] = {
    "invalid_request": ErrorType(
        (400, 405, 422), "the body is not JSON (400); wrong field types, unknown fields or "
        "query parameters, an unknown job kind or tier, a value out of range (422, details "
        "lists the fields); a method the path does not serve (405, Allow lists those it does)"),
    "unauthorized": ErrorType((401,), "no key, or a key nobody holds"),
    "forbidden": ErrorType((403,), "a valid key used for what it may not do (the admin key "
                                   "for jobs, a tenant key for tenants)"),
    "not_found": ErrorType((404,), "no such job for this tenant (another tenant's job "
                                   "included), no such tenant, or no such route"),
    "job_failed": ErrorType((409,), "the result of a job that failed (job_error holds its "
                                    "error)"),
    "idempotency_conflict": ErrorType((409,), "an idempotency_key reused with a different "
                                              "kind or payload (job_id names the first job)"),
    "job_not_ended": ErrorType((409,), "a retry asked of a job that has not ended (job_status "
                                       "names its state)"),
    "job_cancelled": ErrorType((410,), "the result of a job that was cancelled"),
    "job_expired": ErrorType((410,), "the result of a job that expired before it started"),
    "job_gone": ErrorType((410,), "the job was removed after its tier's retention period "
                                  "(its status, result and cancel answer this)"),
    "payload_too_large": ErrorType((413,), "the request body is over the configured limit "
                                           "(limit_bytes)"),
    "unsupported_media_type": ErrorType((415,), "an uploaded document of a type no handler "
                                                "reads (told from its bytes: PDF, UTF-8 text "
                                                "and markdown are read)"),
    "capacity": ErrorType((429,), "the tier's queue is at its bound, or the job could not "
                                  "start within its max_wait_s: ours to fix"),
    "tenant_limit": ErrorType((429,), "this tenant is over its queued quota or its request "
                                      "rate: the client's to fix"),
    "unavailable": ErrorType((503,), "the database or Redis cannot be reached; nothing was "
                                     "accepted"),
    "internal": ErrorType((500,), "a bug: logged, with no traceback in the answer"),
}
_RETRY_AFTER = {"description": "whole seconds, at least 1", "schema": {"type": "integer",
                                                                       "minimum": 1}}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    429: {
        "Retry-After": _RETRY_AFTER,
        "X-Queue-Position": {"description": "jobs that would have been ahead",
                             "schema": {"type": "integer", "minimum": 0}},
        "X-Tier": {"description": "the tenant's tier", "schema": {"type": "string"}},
    },
    503: {"Retry-After": _RETRY_AFTER},
}


def error_responses(*types: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for a route that answers with these error types: one
    per status, in the one error format, its description naming each type and when."""
    by_status: dict[int, list[str]] = {}
    for type_ in types:
        for status in ERROR_TYPES[type_].statuses:
            if status != 405:  # any path may answer 405; no route lists it
                by_status.setdefault(status, []).append(type_)
    out: dict[int | str, dict[str, Any]] = {}
    for status, names in sorted(by_status.items()):
        whens = "; ".join(f"`{name}`: {ERROR_TYPES[name].when}" for name in names)
        entry: dict[str, Any] = {"model": ErrorResponse, "description": whens}
        if status in _HEADERS:
            entry["headers"] = _HEADERS[status]
        out[status] = entry
    return out
