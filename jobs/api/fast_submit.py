"""``POST /v1/jobs`` served in one step when it is the usual submit: the hot path of the API.

A submit through FastAPI pays for the framework more than for the submit: the middleware
stack, the dependency solver, the request and response models' round trips through Python
objects. This ASGI middleware, outermost, answers the common case itself: a JSON body within
the size limit, no query string, and a tenant key the cache holds, with an idempotency key or
without (the tierq client names one on every submit). The body is validated by the route's
own model (``SubmitRequest``, parsed from the bytes by pydantic), the submit is the route's
own call (``jobs.admission.submit``, one threadpool hop), and any error it raises is answered
by the API's own error handlers (``jobs.api.errors``): the answer is the route's, byte for
byte in meaning (``tests/integration/test_fast_submit.py`` compares them).

Anything else is left to FastAPI, with the body already read handed on as it came: a key
that must be looked up, a body the model refuses (its 422 is FastAPI's), a body over the
limit (``BodyLimit`` answers 413).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobs.admission import submit
from jobs.admission.submit import PayloadValidator
from jobs.api.auth import known_principal
from jobs.api.errors import response_for
from jobs.api.schemas import SubmitRequest, SubmitResponse
from jobs.core.errors import TierqError
from jobs.index.notify import Listener
from jobs.process.runtime import Runtime
from jobs.service.tenant_cache import TenantCache

PATH = "/v1/jobs"


class FastSubmit:
    """Outermost middleware: the usual submit answered at once, everything else passed on."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        runtime: Runtime,
        validator: PayloadValidator,
        cache: TenantCache,
        listener: Listener,
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.runtime = runtime
        self.validator = validator
        self.cache = cache
        self.listener = listener
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH
                or scope["query_string"]):
            await self.app(scope, receive, send)
            return
        key, json_body, declared = _headers(scope)
        if key is None or not json_body or (declared or 0) > self.max_body_bytes:
            await self.app(scope, receive, send)
            return
        body, more = await _read(receive, self.max_body_bytes)
        request = None if more else self._request(key, body)
        if request is None:
            await self.app(scope, _replay(body, more, receive), send)
            return
        tenant, submission = request
        try:
            submitted = await run_in_threadpool(
                submit.submit, self.runtime, self.validator, tenant, submission)
        except Exception as exc:
            await response_for(Request(scope, receive), exc)(scope, receive, send)
            return
        await _accepted(submitted, send)

    def _request(self, key: str, body: bytes) -> tuple[Any, submit.Submission] | None:
        """The tenant and the submission, when the usual path applies; else None."""
        self.listener.start()  # the cache keeps tenants only while the listener hears of changes
        try:
            principal = known_principal(self.runtime, key, self.cache)
            parsed = SubmitRequest.model_validate_json(body)
        except (TierqError, pydantic.ValidationError):
            return None  # FastAPI answers it, as it always has
        if principal is None or principal.tenant is None:
            return None
        return principal.tenant, submit.Submission(
            kind=parsed.kind, payload=parsed.payload, idempotency_key=parsed.idempotency_key,
            max_wait_s=parsed.max_wait_s,
            max_attempts=parsed.max_attempts, timeout_s=parsed.timeout_s,
            webhook=None if parsed.webhook is None else parsed.webhook.webhook(),
        )


def _headers(scope: Scope) -> tuple[str | None, bool, int | None]:
    """The bearer key, whether the body is declared JSON, and its declared length."""
    key: str | None = None
    json_body = False
    declared: int | None = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            key = credentials.strip() if scheme.lower() == "bearer" and credentials else None
        elif name == b"content-type":
            json_body = value.split(b";")[0].strip().lower() == b"application/json"
        elif name == b"content-length":
            declared = int(value) if value.isdigit() else None
    return key, json_body, declared


async def _read(receive: Receive, limit: int) -> tuple[bytes, list[Message]]:
    """The body, up to ``limit`` bytes; past it, what was read and the message that crossed
    it (the rest is left to the limit's own middleware)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), [message]
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"".join(chunks), [{**message}]
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), []


def _replay(body: bytes, more: list[Message], receive: Receive) -> Callable[[],
                                                                         Awaitable[Message]]:
    """``receive`` again from the start: the body read so far, then what followed."""
    pending: list[Message] = [{"type": "http.request", "body": body,
                               "more_body": bool(more)}, *more]

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _accepted(submitted: submit.Submitted, send: Send) -> None:
    job_id = submitted.progress.job.id
    body = SubmitResponse.of(submitted.progress).model_dump_json(by_alias=True).encode()
    await send({"type": "http.response.start", "status": 202 if submitted.created else 200,
                "headers": [(b"content-length", str(len(body)).encode()),
                            (b"content-type", b"application/json"),
                            (b"location", f"/v1/jobs/{job_id}".encode())]})
    await send({"type": "http.response.body", "body": body})
