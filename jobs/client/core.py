"""The part of both clients that is neither transport nor awaiting, in one place so that
``Client`` (``jobs.client.http``) and ``AsyncClient`` (``jobs.client.aio``) cannot drift apart:
headers, timeouts, the retry schedule, and the calls of webhooks (a submit's subscription,
the tenant's signing secret, the deliveries of a job or a batch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

from tenacity import RetryCallState, retry_if_exception, stop_after_attempt, stop_before_delay

from jobs.client.protocol import Call, RetryPolicy, Unreachable, retry_delay_s, retryable
from jobs.client.webhooks import Webhook

# What the ``webhook`` keyword of a submit takes.
WebhookArg = Webhook | Mapping[str, Any] | None


@dataclass(frozen=True)
class RetryNotice:
    """A call that will be sent again: why (``error``: a 429, a 503, no answer), after how
    long, and which try that will be of how many at most."""

    error: BaseException
    delay_s: float
    attempt: int
    attempts: int


class ClientCore:
    """What both clients share besides ``jobs.client.protocol``: headers, timeouts and the
    retry schedule. Subclasses add only the transport and the awaiting (or not)."""

    def __init__(self, api_key: str, *, timeout: float, retry: RetryPolicy | None,
                 on_retry: Callable[[RetryNotice], None] | None = None) -> None:
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._on_retry = on_retry
        self._headers = {"Authorization": f"Bearer {api_key}", "User-Agent": "tierq-client"}

    def _retrying_args(self, *, repeatable: bool = True) -> dict[str, Any]:
        """``repeatable=False``: a call that must not run twice (it has no idempotency key)
        is sent again only when the server said it did nothing, never after no answer."""
        policy = self._retry
        args: dict[str, Any] = {
            "stop": stop_after_attempt(policy.attempts) | stop_before_delay(policy.total_s),
            "wait": self._wait_s,
            "retry": retry_if_exception(retryable if repeatable else _refused_or_unavailable),
            "reraise": True,
        }
        if self._on_retry is not None:
            args["before_sleep"] = self._notify
        return args

    def _notify(self, state: RetryCallState) -> None:
        """Tell the caller's ``on_retry`` what was refused and when the call goes again."""
        exc = state.outcome.exception() if state.outcome is not None else None
        if self._on_retry is None or exc is None:
            return
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        self._on_retry(RetryNotice(error=exc, delay_s=float(delay),
                                   attempt=state.attempt_number + 1,
                                   attempts=self._retry.attempts))

    def _wait_s(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        return retry_delay_s(exc, state.attempt_number, self._retry)

    def _request_args(self, call: Call) -> dict[str, Any]:
        headers = dict(call.headers or {})
        if call.content is not None:
            headers["Content-Type"] = call.content_type or "application/octet-stream"
            return {
                "content": call.content,
                "headers": headers,
                "params": call.params,
                "timeout": self._timeout + call.hold_s,
            }
        return {
            "json": call.json,
            "params": call.params,
            "headers": headers or None,
            "timeout": self._timeout + call.hold_s,
        }


def _refused_or_unavailable(exc: BaseException) -> bool:
    return retryable(exc) and not isinstance(exc, Unreachable)


def with_webhook(call: Call, webhook: WebhookArg) -> Call:
    """A submit ``call`` that also names ``webhook``: in its JSON body (``POST /v1/jobs``) or,
    for a body that is not JSON (an NDJSON batch), as ``webhook_url`` and ``webhook_events``
    query parameters."""
    if webhook is None:
        return call
    hook = Webhook.of(webhook)
    if call.content is not None:
        return replace(call, params={**(call.params or {}), **hook.fields()})
    return replace(call, json={**(call.json or {}), "webhook": hook.body()})


def webhook_form(webhook: WebhookArg) -> dict[str, str]:
    """The form fields of a document upload that name ``webhook`` (none for None)."""
    return {} if webhook is None else Webhook.of(webhook).fields()


def webhook_secret_call() -> Call:
    return Call(method="GET", path="/v1/webhooks/secret")


def rotate_webhook_secret_call() -> Call:
    return Call(method="POST", path="/v1/webhooks/secret/rotate")


def deliveries_call(job_id: str) -> Call:
    return Call(method="GET", path=f"/v1/jobs/{quote(job_id, safe='')}/deliveries")


def batch_deliveries_call(batch_id: str) -> Call:
    return Call(method="GET", path=f"/v1/batches/{quote(batch_id, safe='')}/deliveries")
