"""The HTTP side of a webhook try: where its connection may go, how long it may last, and
how much of the answer is read.

A try connects only to an address its name resolved to at that try and was checked as
(``Connections``): one lookup per try, so a name cannot answer the check outside and the
connection inside (DNS rebinding). The request still names the host: its ``Host`` header,
and TLS's server name and certificate check, are the URL's name, as for any client. Through
an egress proxy that the environment names (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``,
``NO_PROXY``) the name is checked the same way, and the proxy connects.

A try has one deadline for all of it, its lookup, connection, TLS handshake, request and
answer (``DeadlineStream``): a receiver that trickles its answer a byte at a time, each
well within any read's timeout, or sends it without end, holds a slot no longer than that.
Of an answer, a ``2xx``'s body is not read at all and another's only its first
``ANSWER_BYTES`` (what the try's record keeps to say why it failed), so a huge answer costs
the dispatcher a few KiB. Each try has its own connection (``Connection: close``), so a
deadline belongs to one try. Redirects are not followed: a ``3xx`` is a failed try like
any other answer that is not a ``2xx``.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from jobs.admission.webhooks import Address, Lookups, Resolve
from jobs.core.webhooks import Reach, literal_address

# Of an answer that is not a ``2xx``, what is read: enough for the try's record.
ANSWER_BYTES = 4096
# A request's body goes out in pieces of this size, each within what is left of the try.
WRITE_BYTES = 16384


class InsideNetwork(Exception):
    """A name resolved to an address tierq must not call: nothing is sent."""


# What a try that got no full answer may end in.
HTTP_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
               httpcore.ProxyError, httpcore.UnsupportedProtocol)


class WebhookClient:
    """POSTs to receivers: ``post`` answers the status and the first bytes of the text, or
    raises ``InsideNetwork`` or one of ``HTTP_ERRORS``."""

    def __init__(
        self, resolve: Resolve, *, reach: Reach, deadline_s: float, connections: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.guard = AddressGuard(Lookups(resolve, threads=connections, per_tenant=connections),
                                  reach=reach)
        self.deadline_s = deadline_s
        self.timeouts = {phase: deadline_s for phase in ("connect", "read", "write", "pool")}
        self.connections = connections
        self.ssl_context = ssl_context
        self.direct = self._pool(Connections(self.guard, deadline_s=deadline_s))
        self.proxies = urllib.request.getproxies_environment()
        self._proxied: dict[str, httpcore.ConnectionPool] = {}
        self._lock = threading.Lock()

    def post(self, url: str, content: bytes, headers: dict[str, str]) -> tuple[int, str]:
        request = httpx.Request("POST", url, content=content, headers={
            **headers, "user-agent": "tierq-webhooks", "connection": "close"})
        target = request.url
        with self._pool_for(target).stream(
                "POST", httpcore.URL(scheme=target.raw_scheme, host=target.raw_host,
                                     port=target.port, target=target.raw_path),
                headers=request.headers.raw, content=request.content,
                extensions={"timeout": self.timeouts}) as answer:
            if 200 <= answer.status < 300:
                return answer.status, ""  # taken: what follows is not read
            kept = bytearray()
            # Cut short by the deadline or the receiver, the answer keeps what came.
            with contextlib.suppress(*HTTP_ERRORS):
                for chunk in answer.iter_stream():
                    kept += chunk[:ANSWER_BYTES - len(kept)]
                    if len(kept) >= ANSWER_BYTES:
                        break  # the connection closes with the rest unread
            return answer.status, kept.decode(errors="replace")

    def close(self) -> None:
        with self._lock:
            pools, self._proxied = [self.direct, *self._proxied.values()], {}
        for pool in pools:
            pool.close()

    def _pool_for(self, target: httpx.URL) -> httpcore.ConnectionPool:
        host = target.raw_host.decode("ascii")
        proxy = self.proxies.get(target.scheme) or self.proxies.get("all")
        if not proxy or urllib.request.proxy_bypass(host):  # NO_PROXY
            return self.direct
        # The proxy connects, to the name: what the name resolves to now is checked here,
        # and the proxy is the guard of what it then connects to.
        self.guard.addresses(host, timeout_s=self.deadline_s)
        with self._lock:
            pool = self._proxied.get(proxy)
            if pool is None:
                pool = self._proxied[proxy] = self._pool(
                    Connections(None, deadline_s=self.deadline_s), proxy=proxy)
            return pool

    def _pool(self, backend: Connections, proxy: str | None = None) -> httpcore.ConnectionPool:
        return httpcore.ConnectionPool(
            ssl_context=self.ssl_context, proxy=None if proxy is None else httpcore.Proxy(proxy),
            max_connections=self.connections, max_keepalive_connections=0,
            network_backend=backend)


class AddressGuard:
    """Where a name may be called: every address it resolves to now, or
    ``InsideNetwork`` when one of them is inside a network that ``reach`` refuses, a
    ``ConnectError`` when it resolves to none, or a
    ``ConnectTimeout`` when its lookup takes longer than the try may."""

    def __init__(self, lookups: Lookups, *, reach: Reach) -> None:
        self.lookups = lookups
        self.reach = reach

    def addresses(self, host: str, *, timeout_s: float) -> list[Address]:
        literal = literal_address(host)
        found = [literal] if literal is not None else self.lookups.addresses(
            host, owner="", timeout_s=timeout_s)
        if found is None:
            raise httpcore.ConnectTimeout(f"the lookup of {host!r} did not end in time")
        if not found:
            raise httpcore.ConnectError(f"the name {host!r} does not resolve")
        if any(self.reach.refuses(address) for address in found):
            raise InsideNetwork(host)
        return found


class Connections(httpcore.NetworkBackend):
    """A try's connections: to an address ``guard`` checked (None: the operator's proxy,
    which is not checked), each ending ``deadline_s`` after it was asked for."""

    def __init__(self, guard: AddressGuard | None, *, deadline_s: float) -> None:
        self.guard = guard
        self.deadline_s = deadline_s
        self.sockets = httpcore.SyncBackend()

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        deadline = time.monotonic() + self.deadline_s
        addresses: list[Any] = [host] if self.guard is None else self.guard.addresses(
            host, timeout_s=self.deadline_s)
        failed: Exception | None = None
        for address in addresses:
            try:
                stream = self.sockets.connect_tcp(
                    str(address), port, _left(deadline, timeout, httpcore.ConnectTimeout),
                    local_address, socket_options)
            except httpcore.ConnectError as exc:  # the next address may answer
                failed = exc
            else:
                return DeadlineStream(stream, deadline)
        assert failed is not None
        raise failed

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class DeadlineStream(httpcore.NetworkStream):
    """A connection that ends at ``deadline`` (``time.monotonic``): each read, write and
    TLS handshake is given what is left of it, and none starts once it has passed. A read
    returns as soon as any bytes come, so an answer trickled a byte at a time still ends
    at the deadline."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: float) -> None:
        self.stream = stream
        self.deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.stream.read(max_bytes, _left(self.deadline, timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_BYTES):
            self.stream.write(buffer[start:start + WRITE_BYTES],
                              _left(self.deadline, timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        secured = self.stream.start_tls(ssl_context, server_hostname,
                                        _left(self.deadline, timeout, httpcore.ConnectTimeout))
        return DeadlineStream(secured, self.deadline)

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)


def _left(deadline: float, timeout: float | None, expired: type[Exception]) -> float:
    """What an operation may take: its own timeout, or less when the deadline is nearer."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the try's deadline has passed")
    return left if timeout is None else min(timeout, left)
