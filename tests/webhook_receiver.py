"""A webhook receiver for tests: an HTTP server on loopback (or HTTPS, with the certificate
of ``tests/tls``: ``receiver.test``, signed by ``CA``) that keeps every POST (its Standard
Webhooks headers and body) and answers what the test says; answers that hang, never end or
are huge (``Answers``); a forward proxy; and the specification's signature check written
out."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

TLS = Path(__file__).parent / "tls"
CA = TLS / "webhook-ca.pem"  # trust this to trust the receiver's certificate


@dataclass
class Received:
    id: str
    timestamp: str
    signature: str
    body: bytes
    at: float = field(default_factory=time.time)

    @property
    def event(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.body)
        return found


class Receiver:
    """An HTTP server on loopback that keeps every POST and answers what ``answer`` says."""

    def __init__(self, port: int, answer: Callable[[Received, int], int], *,
                 tls: bool = False, reply: Callable[[BinaryIO], None] | None = None,
                 host: str = "127.0.0.1") -> None:
        """``port`` 0: any free one; ``tls``: HTTPS, as ``receiver.test``; ``reply``
        writes the whole answer itself, bytes on the wire (``answer`` is not asked);
        ``host``: another loopback address (all of 127.0.0.0/8 is loopback)."""
        self.received: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                got = Received(id=self.headers["webhook-id"],
                               timestamp=self.headers["webhook-timestamp"],
                               signature=self.headers["webhook-signature"], body=body)
                with receiver.lock:
                    receiver.received.append(got)
                    tries = sum(1 for r in receiver.received if r.id == got.id)
                if reply is not None:
                    reply(self.wfile)
                    return
                self.send_response(answer(got, tries))
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.host = host
        self.port = self.server.server_address[1]
        self.scheme = "https" if tls else "http"
        if tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(TLS / "webhook-receiver.pem")
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return self.url_at(self.host)

    def url_at(self, host: str) -> str:
        """Its URL with ``host`` for a name (that the test's resolver finds here)."""
        return f"{self.scheme}://{host}:{self.port}/hook"

    def of_type(self, kind: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.event["type"] == kind]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Answers:
    """Answers that a receiver writes byte by byte, until the client goes away or the test
    ends; ``sent`` counts the bytes the client took."""

    def __init__(self, ended: threading.Event) -> None:
        self.ended = ended
        self.sent = 0
        self.finished = threading.Event()  # the huge answer: sent, or cut off

    def _write(self, out: BinaryIO, data: bytes) -> bool:
        try:
            out.write(data)
            out.flush()
        except OSError:  # the client closed: the answer ends here
            return False
        self.sent += len(data)
        return not self.ended.is_set()

    def endless(self, out: BinaryIO) -> None:
        """``200``, then a body that never ends (no length: it would end with the
        connection), 16 KiB every 10 ms."""
        if self._write(out, b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\n"):
            while self._write(out, b"x" * 16384):
                time.sleep(0.01)

    def trickled_headers(self, out: BinaryIO) -> None:
        """A status line, then a header a byte at a time, never finished."""
        if self._write(out, b"HTTP/1.1 200 OK\r\nx-slow: "):
            while self._write(out, b"a"):
                time.sleep(0.05)

    def trickled_error(self, out: BinaryIO) -> None:
        """``503`` with a body a byte at a time, never finished: each byte comes well
        within any read's timeout."""
        if self._write(out, b"HTTP/1.0 503 Service Unavailable\r\n\r\n"):
            while self._write(out, b"b"):
                time.sleep(0.05)

    def huge_error(self, out: BinaryIO) -> None:
        """``500`` with a 48 MiB body, as fast as it is taken."""
        size = 48 * 2**20
        head = f"HTTP/1.1 500 Internal Server Error\r\ncontent-length: {size}\r\n\r\n"
        try:
            if self._write(out, head.encode()):
                chunk = b"z" * 2**16
                for _ in range(size // len(chunk)):
                    if not self._write(out, chunk):
                        return
        finally:
            self.finished.set()


class ForwardProxy:
    """An HTTP forward proxy on loopback: it takes ``POST http://<name>:<port>/...`` and
    sends it to ``127.0.0.1:<port>``, whatever the name, keeping the URLs it was asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                proxy.asked.append(self.path)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                target = urlsplit(self.path)
                upstream = http.client.HTTPConnection("127.0.0.1", target.port, timeout=10)
                try:
                    upstream.request("POST", target.path, body=body, headers=dict(self.headers))
                    status = upstream.getresponse().status
                finally:
                    upstream.close()
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def signed_by(received: Received, secret: str) -> bool:
    """The specification's check, written out: one of the header's ``v1`` signatures is
    HMAC-SHA256 of ``<id>.<timestamp>.<body>`` under the secret's bytes."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    content = f"{received.id}.{received.timestamp}.".encode() + received.body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    return any(sig == f"v1,{expected}" for sig in received.signature.split(" "))
