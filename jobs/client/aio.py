"""``AsyncClient``: ``Client`` (``jobs.client.http``) for asyncio, the same methods awaited.

In its own module so that each client reads whole; both build on ``jobs.client.core`` and
``jobs.client.protocol``, so their retries and long-polls cannot differ. ``jobs.client`` and
``jobs.client.http`` re-export it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Self

import httpx
from tenacity import AsyncRetrying

from jobs.client.core import (
    ClientCore,
    RetryNotice,
    batch_deliveries_call,
    deliveries_call,
    rotate_webhook_secret_call,
    webhook_secret_call,
    with_webhook,
)
from jobs.client.events import Event, EventParser
from jobs.client.protocol import (
    Call,
    LongPoll,
    RetryPolicy,
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
    parse_value,
    queues_call,
    result_call,
    retry_call,
    submit_batch_call,
    submit_call,
    unreachable,
)
from jobs.client.webhooks import Webhook

__all__ = ["AsyncClient"]


class AsyncClient(ClientCore):
    """``Client`` for asyncio: the same methods, awaited, with the same retries.

    ``async with AsyncClient(url, key) as c: job = await c.submit("echo", {})``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> None:
        """``on_retry``: told of each refusal or failure the client retries, before it
        waits (``RetryNotice``); the schedule is ``retry``'s."""
        super().__init__(api_key, timeout=timeout, retry=retry, on_retry=on_retry)
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=self._headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def submit(
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
        key = idempotency_key or new_idempotency_key()
        call = submit_call(kind, payload, idempotency_key=key, max_wait_s=max_wait_s,
                           max_attempts=max_attempts, timeout_s=timeout_s)
        return await self._send(with_webhook(call, webhook))

    async def get(self, job_id: str, *, wait: float | None = None) -> dict[str, Any]:
        return await self._send(get_call(job_id, wait=wait))

    async def result(self, job_id: str) -> dict[str, Any]:
        """The result (``status`` succeeded), or the status while it is not finished. A
        result kept in the blob store (``result_url``) is fetched into ``result``."""
        body = await self._send(result_call(job_id))
        linked = linked_result_call(body)
        if linked is not None:
            body = {**body, "result": await self._send_value(linked)}
        return body

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self._send(cancel_call(job_id))

    async def retry(self, job_id: str, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a failed, expired or cancelled job again: the new job (``retry_of``), under
        an idempotency key as ``Client.retry``'s."""
        key = idempotency_key or new_idempotency_key()
        return await self._send(retry_call(job_id, idempotency_key=key))

    async def events(self, job_id: str) -> AsyncIterator[Event]:
        """The job's events as they happen (``Client.events``), ending after the terminal
        ``job`` event."""
        async for event in self._events(events_call(job_id)):
            yield event

    async def batch_events(self, batch_id: str) -> AsyncIterator[Event]:
        """The batch's ``batch`` events (``Client.batch_events``)."""
        async for event in self._events(batch_events_call(batch_id)):
            yield event

    async def _events(self, call: Call) -> AsyncIterator[Event]:
        try:
            async with self._http.stream(
                    call.method, call.path,
                    timeout=httpx.Timeout(self._timeout, read=None)) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise error_from_response(response.status_code, response.headers,
                                              response.content)
                parser = EventParser()
                async for line in response.aiter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc

    async def queues(self) -> dict[str, Any]:
        return await self._send(queues_call())

    async def submit_batch(
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
        key = idempotency_key or new_idempotency_key()
        call = submit_batch_call(
            kind, items, idempotency_key=key, max_attempts=max_attempts, timeout_s=timeout_s,
            envelope=envelope, completion_window_s=completion_window_s)
        return await self._send(with_webhook(call, webhook))

    async def webhook_secret(self) -> dict[str, Any]:
        """The tenant's webhook signing secret (``Client.webhook_secret``)."""
        return await self._send(webhook_secret_call())

    async def rotate_webhook_secret(self) -> dict[str, Any]:
        """A new signing secret (``Client.rotate_webhook_secret``); never sent twice."""
        return await self._send(rotate_webhook_secret_call(), repeatable=False)

    async def deliveries(self, job_id: str) -> dict[str, Any]:
        """The job's webhook deliveries (``Client.deliveries``)."""
        return await self._send(deliveries_call(job_id))

    async def batch_deliveries(self, batch_id: str) -> dict[str, Any]:
        """The batch's own webhook deliveries (``Client.batch_deliveries``)."""
        return await self._send(batch_deliveries_call(batch_id))

    async def batch(self, batch_id: str) -> dict[str, Any]:
        return await self._send(batch_call(batch_id))

    async def list_batches(self, *, limit: int = 50) -> dict[str, Any]:
        return await self._send(list_batches_call(limit=limit))

    async def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        return await self._send(cancel_batch_call(batch_id))

    async def batch_results(
        self, batch_id: str, *, after: int = -1, failed_only: bool = False
    ) -> AsyncIterator[dict[str, Any]]:
        call = batch_results_call(batch_id, after=after, failed_only=failed_only)
        try:
            async with self._http.stream(call.method, call.path, params=call.params,
                                         timeout=self._timeout) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise error_from_response(response.status_code, response.headers,
                                              response.content)
                async for line in response.aiter_lines():
                    if line.strip():
                        item: dict[str, Any] = json.loads(line)
                        yield item
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc

    async def list_jobs(self, *, status: str | None = None, limit: int = 50,
                   cursor: str | None = None) -> dict[str, Any]:
        return await self._send(list_call(status=status, limit=limit, cursor=cursor))

    async def wait(
        self,
        job_id: str,
        *,
        # Not asyncio.timeout: this one also shortens the last poll the server may hold.
        timeout: float | None = None,  # noqa: ASYNC109
        on_update: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = 30.0,
    ) -> dict[str, Any]:
        """Long-poll until the job is terminal; ``on_update`` sees every answer.
        Raises ``TimeoutError`` when ``timeout`` passes first."""
        poll = LongPoll(job_id=job_id, timeout=timeout, poll_s=poll_s, started=time.monotonic())
        while True:
            hold = poll.hold_s(time.monotonic())
            asked_at = time.monotonic()
            job = await self.get(job_id, wait=hold)
            if on_update is not None:
                on_update(job)
            pause = poll.pause_s(job, asked_at=asked_at, now=time.monotonic())
            if pause is None:
                return job
            await asyncio.sleep(pause)

    async def _send(self, call: Call, *, repeatable: bool = True) -> dict[str, Any]:
        retrying = AsyncRetrying(**self._retrying_args(repeatable=repeatable))
        result: dict[str, Any] = await retrying(self._send_once, call)
        return result

    async def _send_once(self, call: Call) -> dict[str, Any]:
        body = await self._send_value_once(call)
        return body if isinstance(body, dict) else {}

    async def _send_value(self, call: Call) -> Any:
        return await AsyncRetrying(**self._retrying_args())(self._send_value_once, call)

    async def _send_value_once(self, call: Call) -> Any:
        try:
            response = await self._http.request(
                call.method, call.path, **self._request_args(call)
            )
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc
        return parse_value(response.status_code, response.headers, response.content)
