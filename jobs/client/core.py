"""The part of both clients that is neither transport nor awaiting, in one place so that
``Client`` (``jobs.client.http``) and ``AsyncClient`` (``jobs.client.aio``) cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import RetryCallState, retry_if_exception, stop_after_attempt, stop_before_delay

from jobs.client.protocol import Call, RetryPolicy, retry_delay_s, retryable


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

    def _retrying_args(self) -> dict[str, Any]:
        policy = self._retry
        args: dict[str, Any] = {
            "stop": stop_after_attempt(policy.attempts) | stop_before_delay(policy.total_s),
            "wait": self._wait_s,
            "retry": retry_if_exception(retryable),
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
        if call.content is not None:
            return {
                "content": call.content,
                "headers": {"Content-Type": call.content_type or "application/octet-stream"},
                "params": call.params,
                "timeout": self._timeout + call.hold_s,
            }
        return {
            "json": call.json,
            "params": call.params,
            "timeout": self._timeout + call.hold_s,
        }
