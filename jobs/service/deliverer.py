"""The deliverer: posts each recorded webhook event, signed, until it is taken or a day has
passed.

Every dispatcher process runs one (``tierq dispatcher``; ``tierq up`` included), leader or
standby: events are claimed in SQL (``jobs.store.webhooks``), so any number share the work
and one that dies lets its claims lapse to the others. A try is a POST of ``{"type",
"timestamp", "data"}`` signed as the Standard Webhooks specification says (the
``standardwebhooks`` package; with both secrets while a rotated one still signs), given
``TIMEOUT_S`` to answer, never following a redirect (it could lead inside a network). Its
connection goes where its name resolved to at that try, once the addresses are checked
(``CheckedConnections``): one lookup per try, so a name cannot answer the check outside and
the connection inside; the ``Host`` header and TLS's certificate check are still the
name's. Through an egress proxy that the environment names (``HTTPS_PROXY`` and the like)
the name is checked the same way and the proxy connects. A ``2xx`` delivers it; anything
else is tried again with backoff (``jobs.core.webhooks``) under the same ``webhook-id``,
until a day after the event. Tries run on a bounded pool, at most
``tenant_concurrency`` of one tenant's at once, so one slow receiver holds up no one else:
the read of what is due (``jobs.store.webhooks.due``) takes no more of a tenant's events
than it may still start, none of one at its limit, and gives the tenants turns, so a
backlog of thousands at a receiver that hangs leaves the other slots to everyone else.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets as random_bytes
import ssl
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpcore
import httpx
from standardwebhooks.webhooks import Webhook as Signer

from jobs.admission.webhooks import Resolve, resolved
from jobs.core.webhooks import RETRY_FOR_S, TIMEOUT_S, backoff_s, forbidden, literal_address
from jobs.process.outage import REDIS_OUTAGE, SQL_OUTAGE
from jobs.process.runtime import Runtime
from jobs.store import webhooks as repo
from jobs.store.webhooks import Event

logger = logging.getLogger("tierq.webhooks")

# How often due events are looked for, and how long a claim holds an event: longer than a
# try can take, so a live deliverer's event is never taken from it.
POLL_S = 0.25
CLAIM_S = TIMEOUT_S + 20.0
# A rotated secret keeps signing beside the new one this long.
PREVIOUS_SECRET_S = 24 * 3600.0
# Of an answer's body, what a try's record keeps to say why it failed.
ERROR_CHARS = 300

# What a delivery's ``data`` is made from: the job's (or batch's) body as the API shows it,
# None when it is gone.
Render = Callable[[Event], dict[str, Any] | None]


def new_secret() -> str:
    return "whsec_" + base64.b64encode(random_bytes.token_bytes(24)).decode()


def tenant_secrets(runtime: Runtime, tenant_id: str) -> repo.Secrets:
    """Read (every try signs with them); written once, in a write transaction, when the
    tenant has none yet."""
    with runtime.sessions() as session:
        found = repo.read_secrets(session, tenant_id, now=runtime.clock())
    if found is not None:
        return found
    with runtime.sessions.begin() as session:
        return repo.secrets(session, tenant_id, now=runtime.clock(), made=new_secret())


def rotate_secret(runtime: Runtime, tenant_id: str) -> repo.Secrets:
    with runtime.sessions.begin() as session:
        return repo.rotate(session, tenant_id, made=new_secret(), now=runtime.clock(),
                           previous_for_s=PREVIOUS_SECRET_S)


def signature(secrets: list[str], msg_id: str, at: datetime, body: str) -> str:
    """The ``webhook-signature`` header: one ``v1,<base64>`` per secret, space-separated."""
    return " ".join(Signer(secret).sign(msg_id, at, body) for secret in secrets)


class Deliverer:
    """Claims due events and posts them until ``stop`` is set."""

    def __init__(
        self,
        runtime: Runtime,
        render: Render,
        *,
        concurrency: int | None = None,
        tenant_concurrency: int | None = None,
        timeout_s: float = TIMEOUT_S,
        resolve: Resolve = resolved,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``resolve`` finds a name's addresses (the system's resolver unless a test gives
        another); ``ssl_context`` checks receivers' certificates (the ``certifi`` roots)."""
        settings = runtime.settings
        self.runtime = runtime
        self.render = render
        self.concurrency = concurrency or settings.webhook_concurrency
        self.tenant_concurrency = tenant_concurrency or settings.webhook_tenant_concurrency
        self.timeouts = {phase: timeout_s for phase in ("connect", "read", "write", "pool")}
        self.guard = AddressGuard(resolve, allow_private=settings.webhook_allow_private)
        self.ssl_context = ssl_context
        self.direct = httpcore.ConnectionPool(
            ssl_context=ssl_context, max_connections=self.concurrency,
            network_backend=CheckedConnections(self.guard))
        self.proxies = urllib.request.getproxies_environment()
        self._proxied: dict[str, httpcore.ConnectionPool] = {}
        self._busy: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._done = threading.Event()

    def run(self, stop: threading.Event) -> None:
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="webhook")
        try:
            while not stop.is_set():
                self._done.clear()
                try:
                    for event in self._claim():
                        pool.submit(self._try, event)
                except (*SQL_OUTAGE, *REDIS_OUTAGE):
                    logger.warning("webhooks.claim_failed", exc_info=True)
                    stop.wait(1.0)
                # A finished try frees a slot: look again at once rather than after a poll.
                self._done.wait(POLL_S)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # unposted claims lapse
            self.close()

    def close(self) -> None:
        self.direct.close()
        with self._lock:
            proxied, self._proxied = list(self._proxied.values()), {}
        for pool in proxied:
            pool.close()

    def run_once(self) -> int:
        """Claim what is due and deliver it in this thread: how many events were tried."""
        events = self._claim()
        for event in events:
            self._try(event)
        return len(events)

    def _claim(self) -> list[Event]:
        with self._lock:
            free = self.concurrency - sum(self._busy.values())
            room = {tenant: self.tenant_concurrency - busy
                    for tenant, busy in self._busy.items()}
        if free <= 0:
            return []
        now = self.runtime.clock()
        # The poll reads (no write lock on SQLite while nothing is due); the claim writes.
        with self.runtime.sessions() as session:
            chosen = [event_id for event_id, _ in repo.due(
                session, now=now, limit=free, room=room, tenant_room=self.tenant_concurrency)]
        if not chosen:
            return []
        with self.runtime.sessions.begin() as session:
            events = repo.claim(session, chosen, now=now, until=now + CLAIM_S)
        with self._lock:
            self._busy.update(event.tenant_id for event in events)
        return events

    def _try(self, event: Event) -> None:
        try:
            self._deliver(event)
        except Exception:
            # Its record could not be written (SQL went away): the claim lapses and it is
            # tried again.
            logger.warning("webhooks.try_failed", exc_info=True, extra={"webhook_id": event.id})
        finally:
            with self._lock:
                self._busy[event.tenant_id] -= 1
                if self._busy[event.tenant_id] <= 0:
                    del self._busy[event.tenant_id]
            self._done.set()

    def _deliver(self, event: Event) -> None:
        began = time.monotonic()
        status_code, error, final = self._post(event)
        now = self.runtime.clock()
        next_at: float | None = now + backoff_s(event.tries + 1)
        if final or (next_at or 0) > event.created_at + RETRY_FOR_S:
            next_at = None
        with self.runtime.sessions.begin() as session:
            repo.record_try(session, event, at=now, status_code=status_code, error=error,
                            duration_ms=(time.monotonic() - began) * 1000, next_at=next_at)
        logger.info("webhook.try", extra={
            "event": "webhook.try", "webhook_id": event.id, "type": event.type,
            "status_code": status_code, "error": error, "tenant": event.tenant_id,
            "given_up": error is not None and next_at is None})

    def _post(self, event: Event) -> tuple[int | None, str | None, bool]:
        """The answer's status code, the error (None: delivered), and whether that error
        is final (no later try can succeed)."""
        data = self.render(event)
        if data is None:
            return None, "its job or batch no longer exists", True
        at = datetime.fromtimestamp(self.runtime.clock(), tz=UTC)
        body = json.dumps({"type": event.type, "timestamp": _rfc3339(event.created_at),
                           "data": data}, separators=(",", ":"))
        secrets = tenant_secrets(self.runtime, event.tenant_id).signing
        headers = {"content-type": "application/json", "webhook-id": event.id,
                   "webhook-timestamp": str(int(at.timestamp())),
                   "webhook-signature": signature(secrets, event.id, at, body)}
        try:
            status, text = self._send(event.url, body.encode(), headers)
        except InsideNetwork:
            return None, "the URL points to a loopback, link-local or private address", True
        except HTTP_ERRORS as exc:
            return None, f"{type(exc).__name__}: {exc}"[:ERROR_CHARS] or "no answer", False
        if 200 <= status < 300:
            return status, None, False
        text = text[:ERROR_CHARS].strip()
        return status, f"HTTP {status}" + (f": {text}" if text else ""), False

    def _send(self, url: str, content: bytes, headers: dict[str, str]) -> tuple[int, str]:
        """POST it: the answer's status and text. Straight to the address its name resolved
        to and was checked as (``CheckedConnections``), or through the egress proxy the
        environment names for it, once its name is checked; never following a redirect."""
        request = httpx.Request("POST", url, content=content, headers={
            **headers, "user-agent": "tierq-webhooks", "connection": "close"})
        target = request.url
        pool = self._pool_for(target)
        with pool.stream("POST", httpcore.URL(scheme=target.raw_scheme, host=target.raw_host,
                                              port=target.port, target=target.raw_path),
                         headers=request.headers.raw, content=request.content,
                         extensions={"timeout": self.timeouts}) as answer:
            return answer.status, answer.read().decode(errors="replace")

    def _pool_for(self, target: httpx.URL) -> httpcore.ConnectionPool:
        host = target.raw_host.decode("ascii")
        proxy = self.proxies.get(target.scheme) or self.proxies.get("all")
        if not proxy or urllib.request.proxy_bypass(host):  # NO_PROXY
            return self.direct
        # The proxy connects, to the name: what its name resolves to now is checked here,
        # and the proxy is the guard of what it then connects to.
        self.guard.addresses(host)
        with self._lock:
            pool = self._proxied.get(proxy)
            if pool is None:
                pool = self._proxied[proxy] = httpcore.ConnectionPool(
                    proxy=httpcore.Proxy(proxy), ssl_context=self.ssl_context,
                    max_connections=self.concurrency)
            return pool


class InsideNetwork(Exception):
    """A name resolved to an address tierq must not call: nothing is sent."""


# What a try that got no answer may end in (anything else is a bug, logged by ``_try``).
HTTP_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
               httpcore.ProxyError, httpcore.UnsupportedProtocol)


class AddressGuard:
    """Where a name may be called: every address it resolves to now, or
    ``InsideNetwork`` when one of them is inside a network (unless the operator allows
    private addresses), or a ``ConnectError`` when it resolves to none."""

    def __init__(self, resolve: Resolve, *, allow_private: bool) -> None:
        self.resolve = resolve
        self.allow_private = allow_private

    def addresses(self, host: str) -> list[Any]:
        literal = literal_address(host)
        found = [literal] if literal is not None else list(self.resolve(host))
        if not found:
            raise httpcore.ConnectError(f"the name {host!r} does not resolve")
        if not self.allow_private and any(forbidden(address) for address in found):
            raise InsideNetwork(host)
        return found


class CheckedConnections(httpcore.NetworkBackend):
    """The connections of direct tries: the name is resolved once, here, its addresses
    checked, and the connection made to a checked address, so a name that answers outside
    to the check and inside to a second lookup (DNS rebinding) has no second lookup to
    answer. The request still names the host: its ``Host`` header, and TLS's server name
    and certificate check, are the URL's name, as for any client."""

    def __init__(self, guard: AddressGuard) -> None:
        self.guard = guard
        self.sockets = httpcore.SyncBackend()

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        failed: Exception | None = None
        for address in self.guard.addresses(host):
            try:
                return self.sockets.connect_tcp(str(address), port, timeout, local_address,
                                                socket_options)
            except httpcore.ConnectError as exc:  # the next address may answer
                failed = exc
        assert failed is not None
        raise failed

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _rfc3339(epoch: float) -> str:
    moment = datetime.fromtimestamp(epoch, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
