"""The part of both clients that is neither transport nor awaiting, in one place so that
``Client`` (``jobs.client.http``) and ``AsyncClient`` (``jobs.client.aio``) cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from tenacity import RetryCallState, retry_if_exception, stop_after_attempt, stop_before_delay

from jobs.client.protocol import Call, RetryPolicy, retry_delay_s, retryable


class ClientCore:
    """What both clients share besides ``jobs.client.protocol``: headers, timeouts and the
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
