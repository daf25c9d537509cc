"""uvicorn's HTTP protocol, writing a whole response in one write.

uvicorn writes a response's status line and headers when the app sends them, and its body
when the app sends that: two writes, so two segments on the wire and two wake-ups of the
client for every answer of a few hundred bytes. Under load the API spent a fifth of its CPU
in those writes. Here the head of a response whose length is known (``Content-Length``) is
held until its body comes and goes out with it; a streamed response (an event stream, a
chunked body), an empty one and the answer to a HEAD have their head written at once, as
uvicorn does, so a client sees an event stream connected.
Everything else is uvicorn's own (``httptools``).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle


class _Holding:
    """Stands in for the transport while uvicorn writes a response's head: keeps it."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.head: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.head.append(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Prefixed:
    """Stands in for the transport while uvicorn writes the first part of a body: the held
    head goes out with it, in one write."""

    def __init__(self, transport: Any, head: list[bytes]) -> None:
        self._transport = transport
        self._head = head

    def write(self, data: bytes) -> None:
        self._head.append(data)
        self._transport.write(b"".join(self._head))
        self._head = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingCycle(RequestResponseCycle):
    """uvicorn's request-response cycle, holding the head of a response of known length."""

    _held: list[bytes] | None = None

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not self.response_started:
            transport, holding = self.transport, _Holding(self.transport)
            self.transport = cast(asyncio.Transport, holding)
            try:
                await super().send(message)
            finally:
                self.transport = transport
            if (self.chunked_encoding is False and self.expected_content_length > 0
                    and self.scope["method"] != "HEAD"):
                self._held = holding.head
            elif holding.head:
                transport.write(b"".join(holding.head))  # streamed or empty: at once
            return
        held, self._held = self._held, None
        if not held or kind != "http.response.body":
            await super().send(message)
            return
        transport = self.transport
        self.transport = cast(asyncio.Transport, _Prefixed(transport, held))
        try:
            await super().send(message)
        finally:
            self.transport = transport


class CoalescingProtocol(HttpToolsProtocol):
    """``uvicorn.run(..., http=CoalescingProtocol)``."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = getattr(self, "cycle", None)
        if type(cycle) is RequestResponseCycle:
            cycle.__class__ = CoalescingCycle
