"""Refuse request bodies over the configured size with a 413, before they are parsed.

An ASGI middleware, so it sees bodies as they stream: a declared ``Content-Length`` over the
limit is refused before a byte is read; a chunked body (no length) is counted as it arrives
and refused the moment it crosses the limit, whatever the route was doing with it.
``path_limits`` gives a path its own limit (uploads take more than a job's JSON).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobs.api.errors import error_response

# A refused body this small is read to its end before the answer, so the client, still
# sending, reads the 413 instead of a reset connection; beyond it the connection is cut.
DRAIN_LIMIT_BYTES = 8 * 1024 * 1024


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, path_limits: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"].rstrip("/"), self.max_body_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            if declared <= DRAIN_LIMIT_BYTES:
                await _drain(receive, DRAIN_LIMIT_BYTES)
            await self._refuse(scope, receive, send, limit)
            return
        received = 0
        exceeded = more_body = started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded, more_body
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                more_body = bool(message.get("more_body", False))
                if received > limit:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:
                return  # the route's own answer to the cut body is replaced by the 413
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            if more_body:
                await _drain(receive, DRAIN_LIMIT_BYTES - received)
            await self._refuse(scope, receive, send, limit)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        response = error_response(
            413,
            "payload_too_large",
            f"the request body is over the limit of {limit} bytes",
            headers={"Connection": "close"},
            limit_bytes=limit,
        )
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    value = Headers(scope=scope).get("content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop the rest of the body, up to ``budget`` bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        budget -= len(message.get("body", b""))
