"""The deliverer: posts each recorded webhook event, signed, until it is taken or a day has
passed.

Every dispatcher process runs one (``tierq dispatcher``; ``tierq up`` included), leader or
standby: events are claimed in SQL (``jobs.store.webhooks``), so any number share the work
and one that dies lets its claims lapse to the others. A try is a POST of ``{"type",
"timestamp", "data"}`` signed as the Standard Webhooks specification says (the
``standardwebhooks`` package; with both secrets while a rotated one still signs), given
``TIMEOUT_S`` for all of it, its answer included, never following a redirect (it could
lead inside a network), connecting only to an address checked at that try and reading a few
KiB of an answer at most (``jobs.service.webhook_client``). A ``2xx`` delivers it; anything
else is tried again with backoff (``jobs.core.webhooks``) under the same ``webhook-id``,
until a day after the event; every try is recorded, whatever it ended in. Tries run on a
bounded pool, at most ``tenant_concurrency`` of one tenant's at once, so one slow receiver
holds up no one else: the read of what is due (``jobs.store.webhooks.due``) takes no more
of a tenant's events than it may still start, none of one at its limit, and gives the
tenants turns, so a backlog of thousands at a receiver that hangs leaves the other slots to
everyone else.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets as random_bytes
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook as Signer

from jobs.admission.webhooks import Resolve, resolved, unsendable
from jobs.core.text import storable_text
from jobs.core.webhooks import RETRY_FOR_S, TIMEOUT_S, backoff_s
from jobs.process.outage import REDIS_OUTAGE, SQL_OUTAGE
from jobs.process.runtime import Runtime
from jobs.service.webhook_client import HTTP_ERRORS, InsideNetwork, WebhookClient
from jobs.store import webhooks as repo
from jobs.store.webhooks import Event

logger = logging.getLogger("tierq.webhooks")

# How often due events are looked for, and how long a claim holds an event: longer than a
# try can take, so a live deliverer's event is never taken from it.
POLL_S = 0.25
CLAIM_S = TIMEOUT_S + 20.0
# A rotated secret keeps signing beside the new one this long.
PREVIOUS_SECRET_S = 24 * 3600.0
# Of why a try failed (an answer's body, an error), what its record keeps.
ERROR_CHARS = 300
# What a try cannot be recorded in, or made of, while it lasts: its claim lapses instead.
OUTAGES = (*SQL_OUTAGE, *REDIS_OUTAGE)

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
        """``timeout_s``: all a try may take, its answer included; ``resolve`` finds a
        name's addresses (the system's resolver unless a test gives another);
        ``ssl_context`` checks receivers' certificates (the ``certifi`` roots)."""
        settings = runtime.settings
        self.runtime = runtime
        self.render = render
        self.concurrency = concurrency or settings.webhook_concurrency
        self.tenant_concurrency = tenant_concurrency or settings.webhook_tenant_concurrency
        self.client = WebhookClient(
            resolve, reach=settings.webhook_reach(), deadline_s=timeout_s,
            connections=self.concurrency, ssl_context=ssl_context)
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
            # Tries under way end by their deadline and are recorded, rather than made
            # again once their claims lapse; claims not yet tried lapse.
            pool.shutdown(wait=True, cancel_futures=True)
            self.client.close()

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
        """Try it and record the try, whatever it ended in: only a failure of SQL or Redis
        (where the record would go, or what the delivery is made of) leaves no record, and
        then its claim lapses and it is tried again. An unforeseen error is a failed try
        like any other, tried again with backoff until the day is over."""
        began = time.monotonic()
        try:
            status_code, error, final = self._post(event)
        except OUTAGES:
            raise
        except Exception as exc:
            logger.warning("webhooks.try_broke", exc_info=True, extra={"webhook_id": event.id})
            status_code, error, final = None, f"{type(exc).__name__}: {exc}", False
        now = self.runtime.clock()
        next_at: float | None = now + backoff_s(event.tries + 1)
        if final or (next_at or 0) > event.created_at + RETRY_FOR_S:
            next_at = None
        if error is not None:
            error = storable_text(error, ERROR_CHARS) or "no answer"
        duration_ms = (time.monotonic() - began) * 1000
        try:
            self._record(event, now, status_code, error, duration_ms, next_at)
        except OUTAGES:
            raise
        except Exception as exc:  # what it ended in could not be stored: that it ended is
            logger.warning("webhooks.record_failed", exc_info=True,
                           extra={"webhook_id": event.id})
            error = f"its outcome could not be stored ({type(exc).__name__})"
            self._record(event, now, None, error, duration_ms, next_at)
        logger.info("webhook.try", extra={
            "event": "webhook.try", "webhook_id": event.id, "type": event.type,
            "status_code": status_code, "error": error, "tenant": event.tenant_id,
            "given_up": error is not None and next_at is None})

    def _record(self, event: Event, at: float, status_code: int | None, error: str | None,
                duration_ms: float, next_at: float | None) -> None:
        with self.runtime.sessions.begin() as session:
            repo.record_try(session, event, at=at, status_code=status_code, error=error,
                            duration_ms=duration_ms, next_at=next_at)

    def _post(self, event: Event) -> tuple[int | None, str | None, bool]:
        """The answer's status code, the error (None: delivered), and whether that error
        is final (no later try can succeed)."""
        refused = unsendable(event.url)  # stored before submits were refused such URLs
        if refused is not None:
            return None, f"the URL cannot be sent: {refused}", True
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
            status, text = self.client.post(event.url, body.encode(), headers)
        except InsideNetwork:
            return None, "the URL points to a loopback, link-local or private address", True
        except HTTP_ERRORS as exc:
            return None, f"{type(exc).__name__}: {exc}", False
        if 200 <= status < 300:
            return status, None, False
        text = text.strip()
        return status, f"HTTP {status}" + (f": {text}" if text else ""), False


def _rfc3339(epoch: float) -> str:
    moment = datetime.fromtimestamp(epoch, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
