"""A small HTTP client for the tierq API (httpx): ``Client``, and ``AsyncClient`` (from
``jobs.client.aio``, re-exported here).

Requests, responses, typed errors and the retry and long-poll decisions are pure functions
in ``jobs.client.protocol``, headers, timeouts and the retry schedule are ``jobs.client.core``;
the two clients add only the transport and the loops that sleep or await, so they cannot
drift apart.

Retries: a ``capacity`` refusal (429) or ``unavailable`` (503) is retried, honouring
``Retry-After`` (capped and jittered), as are connection errors; a ``tenant_limit`` refusal
never is: it is the client's own limit, and the server's message says which. Every submit
carries an idempotency key (a fresh one unless given), so a retry after a lost response
can never create a second job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import httpx
from tenacity import Retrying

from jobs.client.aio import AsyncClient
from jobs.client.core import (
    ClientCore,
    RetryNotice,
    batch_deliveries_call,
    deliveries_call,
    rotate_webhook_secret_call,
    webhook_form,
    webhook_secret_call,
    with_webhook,
)
from jobs.client.events import Event, parse_events
from jobs.client.protocol import (
    TERMINAL_STATUSES,
    ApiError,
    Call,
    LongPoll,
    NotFound,
    Refused,
    RetryPolicy,
    Unauthorized,
    Unavailable,
    Unreachable,
    batch_call,
    batch_events_call,
    batch_results_call,
    cancel_batch_call,
    cancel_call,
    error_from_response,
    events_call,
    get_call,
    linked_result_call,
    list_batches_call,
    list_call,
    new_idempotency_key,
    parse_response,
    parse_value,
    queues_call,
    result_call,
    retry_call,
    submit_batch_call,
    submit_call,
    unreachable,
)
from jobs.client.webhooks import Webhook

__all__ = [
    "TERMINAL_STATUSES",
    "ApiError",
    "AsyncClient",
    "Client",
    "Event",
    "NotFound",
    "Refused",
    "RetryPolicy",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
]


class Client(ClientCore):
    """``with Client(url, key) as c: job = c.submit("echo", {"a": 1}); c.wait(job["id"])``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> None:
        """``on_retry``: told of each refusal or failure the client retries, before it
        waits (``RetryNotice``); the schedule is ``retry``'s."""
        super().__init__(api_key, timeout=timeout, retry=retry, on_retry=on_retry)
        self._http = httpx.Client(
            base_url=base_url, headers=self._headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def submit(
        self,
        kind: str,
        payload: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        max_wait_s: float | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        webhook: Webhook | Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``webhook``: where to POST the job's events (``Webhook``, or ``{"url",
        "events"}``), signed with the tenant's secret (``webhook_secret``)."""
        key = idempotency_key or new_idempotency_key()
        call = submit_call(kind, payload, idempotency_key=key, max_wait_s=max_wait_s,
                           max_attempts=max_attempts, timeout_s=timeout_s)
        return self._send(with_webhook(call, webhook))

    def upload(
        self,
        path: str | Path,
        *,
        kind: str = "document.embed",
        max_wait_s: float | None = None,
        timeout: float = 120.0,
        webhook: Webhook | Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Upload a document and submit a job of ``kind`` for it: the job's body plus
        ``document`` (sha256, bytes, content_type). ``webhook``: as ``submit``'s.

        Retried on refusals and outages (nothing was submitted), never after the request
        may have reached the server: an upload carries no idempotency key."""
        file = Path(path)
        data = file.read_bytes()
        form = {"kind": kind, **webhook_form(webhook)}
        if max_wait_s is not None:
            form["max_wait_s"] = str(max_wait_s)

        def once() -> dict[str, Any]:
            try:
                response = self._http.post(
                    "/v1/documents", files={"file": (file.name, data)}, data=form,
                    timeout=max(self._timeout, timeout),
                )
            except httpx.TransportError as exc:
                raise unreachable(exc) from exc
            return parse_response(response.status_code, response.headers, response.content)

        result: dict[str, Any] = Retrying(**self._retrying_args(repeatable=False))(once)
        return result

    def get(self, job_id: str, *, wait: float | None = None) -> dict[str, Any]:
        return self._send(get_call(job_id, wait=wait))

    def result(self, job_id: str) -> dict[str, Any]:
        """The result (``status`` succeeded), or the status while it is not finished. A
        result kept in the blob store (``result_url``) is fetched into ``result``."""
        body = self._send(result_call(job_id))
        linked = linked_result_call(body)
        if linked is not None:
            body = {**body, "result": self._send_value(linked)}
        return body

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._send(cancel_call(job_id))

    def retry(self, job_id: str, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a failed, expired or cancelled job again: the new job (``retry_of``). A
        fresh idempotency key unless given, the same on each resend of this call, so a retry
        whose answer was lost makes no second job."""
        key = idempotency_key or new_idempotency_key()
        return self._send(retry_call(job_id, idempotency_key=key))

    def queues(self) -> dict[str, Any]:
        return self._send(queues_call())

    def list_jobs(self, *, status: str | None = None, limit: int = 50,
             cursor: str | None = None) -> dict[str, Any]:
        """One page of this tenant's jobs, newest first: ``{"jobs": [...], "next_cursor"}``."""
        return self._send(list_call(status=status, limit=limit, cursor=cursor))

    def submit_batch(
        self,
        kind: str,
        items: Iterable[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        envelope: bool = False,
        completion_window_s: float | None = None,
        webhook: Webhook | Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Store a batch (sent as NDJSON); its items enter the live queue as room allows.
        A fresh idempotency key unless given, so a retried upload never stores it twice.
        ``envelope``: each item is ``{"custom_id": ..., "payload": {...}}``, the id handed
        back on its result line; ``completion_window_s``: items not started by then expire;
        ``webhook``: where to POST ``batch.completed`` (events ``completed``) and each
        ``batch.item.completed`` (``item.completed``)."""
        key = idempotency_key or new_idempotency_key()
        call = submit_batch_call(
            kind, items, idempotency_key=key, max_attempts=max_attempts, timeout_s=timeout_s,
            envelope=envelope, completion_window_s=completion_window_s)
        return self._send(with_webhook(call, webhook))

    def webhook_secret(self) -> dict[str, Any]:
        """The tenant's webhook signing secret: ``{"secret": "whsec_...",
        "previous_valid_until"}`` (until when the secret it replaced still signs too)."""
        return self._send(webhook_secret_call())

    def rotate_webhook_secret(self) -> dict[str, Any]:
        """Make a new signing secret (same shape as ``webhook_secret``); the old one signs
        beside it for a day. Never sent twice: a second rotation would end the old one."""
        return self._send(rotate_webhook_secret_call(), repeatable=False)

    def deliveries(self, job_id: str) -> dict[str, Any]:
        """The job's webhook deliveries, each with its tries: ``{"deliveries": [...]}``."""
        return self._send(deliveries_call(job_id))

    def batch_deliveries(self, batch_id: str) -> dict[str, Any]:
        """The batch's own webhook deliveries (``batch.completed``; its items' are under
        each item's job): ``{"deliveries": [...]}``."""
        return self._send(batch_deliveries_call(batch_id))

    def batch(self, batch_id: str) -> dict[str, Any]:
        """The batch now: counts by state, ``status``, ``estimated_finish_s``."""
        return self._send(batch_call(batch_id))

    def list_batches(self, *, limit: int = 50) -> dict[str, Any]:
        return self._send(list_batches_call(limit=limit))

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        return self._send(cancel_batch_call(batch_id))

    def batch_results(
        self, batch_id: str, *, after: int = -1, failed_only: bool = False
    ) -> Iterator[dict[str, Any]]:
        """The finished items past ``after`` (``failed_only``: those that did not succeed),
        one dict a line as the server streams them."""
        call = batch_results_call(batch_id, after=after, failed_only=failed_only)
        try:
            with self._http.stream(call.method, call.path, params=call.params,
                                   timeout=self._timeout) as response:
                if response.status_code != 200:
                    response.read()
                    raise error_from_response(response.status_code, response.headers,
                                              response.content)
                for line in response.iter_lines():
                    if line.strip():
                        item: dict[str, Any] = json.loads(line)
                        yield item
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc

    def events(self, job_id: str) -> Iterator[Event]:
        """The job's events as they happen (``GET /v1/jobs/<id>/events``): first ``job``
        (its body), then ``job`` on each change and ``progress`` on each report of its
        handler; the iterator ends after the terminal ``job`` event."""
        yield from self._events(events_call(job_id))

    def batch_events(self, batch_id: str) -> Iterator[Event]:
        """The batch's body (``batch`` events: counts by state, ``status``), at once and on
        each change of its counts; the iterator ends once no item is left to run."""
        yield from self._events(batch_events_call(batch_id))

    def _events(self, call: Call) -> Iterator[Event]:
        try:
            with self._http.stream(call.method, call.path,
                                   timeout=httpx.Timeout(self._timeout, read=None)) as response:
                if response.status_code != 200:
                    response.read()
                    raise error_from_response(response.status_code, response.headers,
                                              response.content)
                yield from parse_events(response.iter_lines())
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc

    def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        on_update: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = 30.0,
    ) -> dict[str, Any]:
        """Long-poll until the job is terminal; ``on_update`` sees every answer.
        Raises ``TimeoutError`` when ``timeout`` passes first."""
        poll = LongPoll(job_id=job_id, timeout=timeout, poll_s=poll_s, started=time.monotonic())
        while True:
            hold = poll.hold_s(time.monotonic())
            asked_at = time.monotonic()
            job = self.get(job_id, wait=hold)
            if on_update is not None:
                on_update(job)
            pause = poll.pause_s(job, asked_at=asked_at, now=time.monotonic())
            if pause is None:
                return job
            time.sleep(pause)

    def _send(self, call: Call, *, repeatable: bool = True) -> dict[str, Any]:
        retrying = Retrying(**self._retrying_args(repeatable=repeatable))
        result: dict[str, Any] = retrying(self._send_once, call)
        return result

    def _send_once(self, call: Call) -> dict[str, Any]:
        body = self._send_value_once(call)
        return body if isinstance(body, dict) else {}

    def _send_value(self, call: Call) -> Any:
        return Retrying(**self._retrying_args())(self._send_value_once, call)

    def _send_value_once(self, call: Call) -> Any:
        try:
            response = self._http.request(call.method, call.path, **self._request_args(call))
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc
        return parse_value(response.status_code, response.headers, response.content)
