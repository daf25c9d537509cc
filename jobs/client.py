"""A small HTTP client for the tierq API (httpx): ``Client`` and ``AsyncClient``.

Requests are described by pure functions that return a ``Call``, and responses are turned
into dicts or typed errors by ``parse_response``; the retry decision (``retryable``), its
delay (``retry_delay_s``) and the long-poll decisions (``LongPoll``) are pure too. The two
clients add only the transport and the loops that sleep or await, so they cannot drift apart.

Retries: a ``capacity`` refusal (429) or ``unavailable`` (503) is retried, honouring
``Retry-After`` (capped and jittered), as are connection errors; a ``tenant_limit`` refusal
never is: it is the client's own limit, and the server's message says which. Every submit
carries an idempotency key (a fresh one unless given), so a retry after a lost response
can never create a second job.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
)

from jobs.errors import TierqError
from jobs.states import TERMINAL

TERMINAL_STATUSES = frozenset(status.value for status in TERMINAL)
# A long poll that comes back sooner than this without news is not repeated at once.
_MIN_POLL_INTERVAL_S = 0.25


class ApiError(TierqError):
    """An error answer from the API (or no answer at all: ``Unreachable``)."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        body: Any = None,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.body = body
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"


class Refused(ApiError):
    """429: nothing was accepted. ``type`` is ``capacity`` (the tier is full: try later)
    or ``tenant_limit`` (this tenant's own quota or rate)."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        body: Any = None,
        *,
        retry_after_s: float | None = None,
        queue_position: int | None = None,
        tier: str | None = None,
    ) -> None:
        super().__init__(status, type, message, body, retry_after_s=retry_after_s)
        self.queue_position = queue_position
        self.tier = tier


class Unavailable(ApiError):
    """503: the server's database or Redis cannot be reached; nothing was accepted."""


class NotFound(ApiError):
    """404: no such job for this tenant."""


class Unauthorized(ApiError):
    """401: missing or unknown key."""


class Unreachable(ApiError):
    """No HTTP answer (connection refused, timeout); ``status`` is 0."""


_ERROR_CLASSES: dict[int, type[ApiError]] = {
    401: Unauthorized,
    404: NotFound,
    503: Unavailable,
}


@dataclass(frozen=True, kw_only=True)
class Call:
    """One request, described without doing it."""

    method: str
    path: str
    json: Mapping[str, Any] | None = None
    params: Mapping[str, str] | None = None
    # The server may hold the request this long (long poll): added to the read timeout.
    hold_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    attempts: int = 5  # requests in all, the first included
    total_s: float = 120.0  # no retry whose wait would end later than this after the first
    max_delay_s: float = 30.0  # cap on one wait, whatever Retry-After says
    jitter: float = 0.25  # each wait is stretched by up to this fraction
    backoff_s: float = 0.5  # first wait when the server gave no Retry-After


def _job_path(job_id: str) -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}"


def new_idempotency_key() -> str:
    return f"auto-{uuid.uuid4().hex}"


def submit_call(
    kind: str,
    payload: Mapping[str, Any],
    *,
    idempotency_key: str,
    max_wait_s: float | None = None,
    max_attempts: int | None = None,
) -> Call:
    body: dict[str, Any] = {
        "kind": kind,
        "payload": dict(payload),
        "idempotency_key": idempotency_key,
    }
    if max_wait_s is not None:
        body["max_wait_s"] = max_wait_s
    if max_attempts is not None:
        body["max_attempts"] = max_attempts
    return Call(method="POST", path="/v1/jobs", json=body)


def get_call(job_id: str, *, wait: float | None = None) -> Call:
    if wait is None:
        return Call(method="GET", path=_job_path(job_id))
    seconds = max(1, min(60, math.ceil(wait)))
    return Call(method="GET", path=_job_path(job_id), params={"wait": str(seconds)}, hold_s=seconds)


def result_call(job_id: str) -> Call:
    return Call(method="GET", path=_job_path(job_id) + "/result")


def cancel_call(job_id: str) -> Call:
    return Call(method="POST", path=_job_path(job_id) + "/cancel")


def queues_call() -> Call:
    return Call(method="GET", path="/v1/queues")


def _decode(content: bytes) -> Any:
    if not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return content.decode("utf-8", errors="replace")


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def parse_response(status: int, headers: Mapping[str, str], content: bytes) -> dict[str, Any]:
    """The JSON object of a 2xx answer; any other answer raises its typed ``ApiError``."""
    if 200 <= status < 300:
        body = _decode(content)
        return body if isinstance(body, dict) else {}
    raise error_from_response(status, headers, content)


def error_from_response(status: int, headers: Mapping[str, str], content: bytes) -> ApiError:
    body = _decode(content)
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    type_ = str(error.get("type") or f"http_{status}")
    message = str(error.get("message") or f"HTTP {status}")
    retry_after = _number(headers.get("retry-after"))
    if retry_after is None:
        retry_after = _number(error.get("retry_after_seconds"))
    if status == 429:
        position = _number(headers.get("x-queue-position", error.get("queue_position")))
        return Refused(
            status,
            type_,
            message,
            body,
            retry_after_s=retry_after,
            queue_position=None if position is None else int(position),
            tier=headers.get("x-tier") or error.get("tier"),
        )
    cls = _ERROR_CLASSES.get(status, ApiError)
    return cls(status, type_, message, body, retry_after_s=retry_after)


def retryable(exc: BaseException) -> bool:
    """Saturation and outages pass; a tenant's own limit does not."""
    if isinstance(exc, Refused):
        return exc.type == "capacity"
    return isinstance(exc, Unavailable | Unreachable)


def retry_delay_s(
    exc: BaseException | None,
    attempt: int,
    policy: RetryPolicy,
    *,
    rand: Callable[[], float] = random.random,
) -> float:
    """Wait before request ``attempt + 1``: Retry-After if given, else exponential; capped,
    then stretched by a random fraction so many clients do not return in step."""
    hinted = exc.retry_after_s if isinstance(exc, ApiError) else None
    base = hinted if hinted is not None else policy.backoff_s * 2.0 ** max(0, attempt - 1)
    return min(policy.max_delay_s, base) * (1.0 + policy.jitter * rand())


@dataclass(kw_only=True)
class LongPoll:
    """The decisions of ``wait`` without its I/O: how long each poll may be held, when to give
    up, and when to pause (a server that answers at once, with no news, is not hammered)."""

    job_id: str
    timeout: float | None
    poll_s: float
    started: float
    last_status: str | None = None

    def hold_s(self, now: float) -> float:
        """Seconds the next poll may be held; ``TimeoutError`` once ``timeout`` has passed."""
        if self.timeout is None:
            return self.poll_s
        remaining = self.started + self.timeout - now
        if remaining <= 0:
            raise TimeoutError(f"job {self.job_id} not finished after {self.timeout:g} s")
        return min(self.poll_s, remaining)

    def pause_s(self, job: Mapping[str, Any], *, asked_at: float, now: float) -> float | None:
        """None when ``job`` is terminal (stop); else the seconds to pause before polling."""
        status = job.get("status")
        if status in TERMINAL_STATUSES:
            return None
        quick = now - asked_at < _MIN_POLL_INTERVAL_S
        pause = _MIN_POLL_INTERVAL_S if quick and status == self.last_status else 0.0
        self.last_status = status if isinstance(status, str) else None
        return pause


def _unreachable(exc: httpx.TransportError) -> Unreachable:
    return Unreachable(0, "unreachable", f"{type(exc).__name__}: {exc}")


class _ClientCore:
    """What both clients share besides the pure functions above: headers, timeouts and the
    retry schedule. Subclasses add only the transport and the awaiting (or not)."""

    def __init__(self, api_key: str, *, timeout: float, retry: RetryPolicy | None) -> None:
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._headers = {"Authorization": f"Bearer {api_key}", "User-Agent": "tierq-client"}

    def _retrying_args(self) -> dict[str, Any]:
        policy = self._retry
        return {
            "stop": stop_after_attempt(policy.attempts) | stop_before_delay(policy.total_s),
            "wait": self._wait_s,
            "retry": retry_if_exception(retryable),
            "reraise": True,
        }

    def _wait_s(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        return retry_delay_s(exc, state.attempt_number, self._retry)

    def _request_args(self, call: Call) -> dict[str, Any]:
        return {
            "json": call.json,
            "params": call.params,
            "timeout": self._timeout + call.hold_s,
        }


class Client(_ClientCore):
    """``with Client(url, key) as c: job = c.submit("echo", {"a": 1}); c.wait(job["id"])``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(api_key, timeout=timeout, retry=retry)
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
    ) -> dict[str, Any]:
        key = idempotency_key or new_idempotency_key()
        return self._send(submit_call(kind, payload, idempotency_key=key,
                                      max_wait_s=max_wait_s, max_attempts=max_attempts))

    def get(self, job_id: str, *, wait: float | None = None) -> dict[str, Any]:
        return self._send(get_call(job_id, wait=wait))

    def result(self, job_id: str) -> dict[str, Any]:
        """The result (``status`` succeeded), or the status while it is not finished."""
        return self._send(result_call(job_id))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._send(cancel_call(job_id))

    def queues(self) -> dict[str, Any]:
        return self._send(queues_call())

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

    def _send(self, call: Call) -> dict[str, Any]:
        result: dict[str, Any] = Retrying(**self._retrying_args())(self._send_once, call)
        return result

    def _send_once(self, call: Call) -> dict[str, Any]:
        try:
            response = self._http.request(call.method, call.path, **self._request_args(call))
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc
        return parse_response(response.status_code, response.headers, response.content)


class AsyncClient(_ClientCore):
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
    ) -> None:
        super().__init__(api_key, timeout=timeout, retry=retry)
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
    ) -> dict[str, Any]:
        key = idempotency_key or new_idempotency_key()
        return await self._send(submit_call(kind, payload, idempotency_key=key,
                                            max_wait_s=max_wait_s, max_attempts=max_attempts))

    async def get(self, job_id: str, *, wait: float | None = None) -> dict[str, Any]:
        return await self._send(get_call(job_id, wait=wait))

    async def result(self, job_id: str) -> dict[str, Any]:
        """The result (``status`` succeeded), or the status while it is not finished."""
        return await self._send(result_call(job_id))

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self._send(cancel_call(job_id))

    async def queues(self) -> dict[str, Any]:
        return await self._send(queues_call())

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

    async def _send(self, call: Call) -> dict[str, Any]:
        retrying = AsyncRetrying(**self._retrying_args())
        result: dict[str, Any] = await retrying(self._send_once, call)
        return result

    async def _send_once(self, call: Call) -> dict[str, Any]:
        try:
            response = await self._http.request(
                call.method, call.path, **self._request_args(call)
            )
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc
        return parse_response(response.status_code, response.headers, response.content)
