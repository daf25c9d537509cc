"""The tierq client's pure layer: requests as ``Call`` values, responses as dicts or typed
errors, and the retry and long-poll decisions. No I/O here: ``jobs.client.http`` adds the
transports (sync and async), so the two clients cannot drift apart.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from jobs.core.errors import TierqError
from jobs.core.states import TERMINAL

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

    def __str__(self) -> str:
        return f"the API did not answer: {self.message}"


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
    # A body that is not JSON (a batch's NDJSON), with its content type.
    content: bytes | None = None
    content_type: str | None = None
    # Headers of this call besides the client's own (a retry's ``Idempotency-Key``).
    headers: Mapping[str, str] | None = None


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
    timeout_s: float | None = None,
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
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    return Call(method="POST", path="/v1/jobs", json=body)


def get_call(job_id: str, *, wait: float | None = None) -> Call:
    if wait is None:
        return Call(method="GET", path=_job_path(job_id))
    seconds = max(1, min(60, math.ceil(wait)))
    return Call(method="GET", path=_job_path(job_id), params={"wait": str(seconds)}, hold_s=seconds)


def events_call(job_id: str) -> Call:
    return Call(method="GET", path=_job_path(job_id) + "/events")


def result_call(job_id: str) -> Call:
    return Call(method="GET", path=_job_path(job_id) + "/result")


def cancel_call(job_id: str) -> Call:
    return Call(method="POST", path=_job_path(job_id) + "/cancel")


def list_call(*, status: str | None = None, limit: int = 50, cursor: str | None = None) -> Call:
    params = {"limit": str(limit)}
    if status is not None:
        params["status"] = status
    if cursor is not None:
        params["cursor"] = cursor
    return Call(method="GET", path="/v1/jobs", params=params)


def _batch_path(batch_id: str) -> str:
    return f"/v1/batches/{quote(batch_id, safe='')}"


def ndjson(items: Iterable[Mapping[str, Any]]) -> bytes:
    """Items as NDJSON, one compact JSON object a line."""
    return b"".join(json.dumps(dict(item), separators=(",", ":")).encode() + b"\n"
                    for item in items)


def submit_batch_call(
    kind: str,
    items: Iterable[Mapping[str, Any]],
    *,
    idempotency_key: str,
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    envelope: bool = False,
    completion_window_s: float | None = None,
) -> Call:
    """A batch as NDJSON (the server reads it as it streams); ``envelope``: each item is
    ``{"custom_id", "payload"}``."""
    params = {"kind": kind, "idempotency_key": idempotency_key}
    if envelope:
        params["envelope"] = "true"
    if completion_window_s is not None:
        params["completion_window_s"] = repr(float(completion_window_s))
    if max_attempts is not None:
        params["max_attempts"] = str(max_attempts)
    if timeout_s is not None:
        params["timeout_s"] = repr(float(timeout_s))
    return Call(method="POST", path="/v1/batches", params=params, content=ndjson(items),
                content_type="application/x-ndjson")


def batch_call(batch_id: str) -> Call:
    return Call(method="GET", path=_batch_path(batch_id))


def batch_events_call(batch_id: str) -> Call:
    return Call(method="GET", path=_batch_path(batch_id) + "/events")


def batch_results_call(batch_id: str, *, after: int = -1, failed_only: bool = False) -> Call:
    params = {"after": str(after)}
    if failed_only:
        params["status"] = "failed"
    return Call(method="GET", path=_batch_path(batch_id) + "/results", params=params)


def retry_call(job_id: str, *, idempotency_key: str) -> Call:
    """A retry under a key of its own: sent again after a lost answer, it makes no second
    job (the server answers the first one's)."""
    return Call(method="POST", path=_job_path(job_id) + "/retry",
                headers={"Idempotency-Key": idempotency_key})


def cancel_batch_call(batch_id: str) -> Call:
    return Call(method="POST", path=_batch_path(batch_id) + "/cancel")


def list_batches_call(*, limit: int = 50) -> Call:
    return Call(method="GET", path="/v1/batches", params={"limit": str(limit)})


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
    body = parse_value(status, headers, content)
    return body if isinstance(body, dict) else {}


def parse_value(status: int, headers: Mapping[str, str], content: bytes) -> Any:
    """The JSON value of a 2xx answer (a result behind ``result_url`` may be any JSON)."""
    if 200 <= status < 300:
        return _decode(content)
    raise error_from_response(status, headers, content)


def linked_result_call(body: Mapping[str, Any]) -> Call | None:
    """The call that fetches a result kept in the blob store, when ``/result`` linked one."""
    url = body.get("result_url")
    return Call(method="GET", path=str(url)) if url else None


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


def unreachable(exc: httpx.TransportError) -> Unreachable:
    return Unreachable(0, "unreachable", f"{type(exc).__name__}: {exc}")
