"""The API's HTTP protocol (``jobs.api.http_protocol``) on a real uvicorn server and real
sockets: a response of known length leaves in one write, whole; a streamed one has its head
written at once; HEAD and empty answers are uvicorn's as ever."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from jobs.api.http_protocol import CoalescingProtocol

pytestmark = pytest.mark.integration

BODY = b'{"id": "x", "status": "queued"}'


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await asyncio.sleep(0.5)  # the first event comes late: the head must not wait for it
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if path == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 202,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


WRITES: list[bytes] = []  # what the server's transports were asked to write, in order


class _Counted:
    """A transport that records each write before passing it on."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def counting(protocol: type[Any]) -> type[Any]:
    class Counting(protocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(_Counted(transport))

    return Counting


@contextlib.contextmanager
def serving(protocol: type[Any]) -> Iterator[tuple[str, int]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="none",
                            http=counting(protocol))
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not running.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield "127.0.0.1", port
    finally:
        running.should_exit = True
        thread.join(timeout=20)
        sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    with serving(CoalescingProtocol) as address:
        yield address


def _post(address: tuple[str, int]) -> list[bytes]:
    """The writes the server made for one POST answered whole."""
    WRITES.clear()
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}", timeout=5) as client:
        response = client.post("/v1/jobs")
    assert (response.status_code, response.content) == (202, BODY)
    return list(WRITES)


def test_a_response_of_known_length_is_one_write(server: tuple[str, int]) -> None:
    for _ in range(3):
        writes = _post(server)
        assert len(writes) == 1
        head, _, body = writes[0].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 202 ") and body == BODY


def test_uvicorns_own_protocol_writes_it_in_two() -> None:
    """The control: what the protocol saves."""
    with serving(HttpToolsProtocol) as address:
        assert len(_post(address)) == 2


def test_a_streamed_response_has_its_head_at_once(server: tuple[str, int]) -> None:
    url = f"http://{server[0]}:{server[1]}"
    with httpx.Client(base_url=url, timeout=5) as client:
        began = time.monotonic()
        with client.stream("GET", "/stream") as response:
            headed = time.monotonic() - began
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            assert b"".join(response.iter_bytes()) == b"data: 1\n\n"
    assert headed < 0.4  # before the first event (0.5 s)


def test_head_empty_and_keep_alive_answers_are_uvicorns(server: tuple[str, int]) -> None:
    url = f"http://{server[0]}:{server[1]}"
    with httpx.Client(base_url=url, timeout=5) as client:
        for _ in range(3):  # one connection, kept alive between them
            posted = client.post("/v1/jobs")
            assert (posted.status_code, posted.content) == (202, BODY)
            head = client.head("/v1/jobs")
            assert head.status_code == 202 and head.content == b""
            assert head.headers["content-length"] == str(len(BODY))
            empty = client.get("/empty")
            assert (empty.status_code, empty.content) == (204, b"")
