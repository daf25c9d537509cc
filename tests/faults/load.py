"""A steady stream of submissions from a client thread, recording every answer.

Used by the outage tests: while a backend is down, every answer must be a 202 or a 503
``unavailable`` with ``Retry-After`` (never a 500, never a hung request), and every job that
got its 202 must finish.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

# Longer than any answer the API may take while a backend is down (its connect timeouts
# are a few seconds); a request that reaches it counts as hung.
REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True, kw_only=True)
class Answer:
    status: int | None  # None: no answer (timeout or transport error)
    error_type: str | None = None
    retry_after: str | None = None
    job_id: str | None = None
    failure: str | None = None


@dataclass
class SubmitLoad:
    """Submits ``tracked`` jobs round-robin over ``clients`` every ``period_s`` until
    ``stop()`` or ``max_jobs`` submissions."""

    clients: list[httpx.Client]
    payload: dict[str, Any]
    period_s: float = 0.1
    max_jobs: int = 150
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> SubmitLoad:
        self._thread = threading.Thread(target=self._run, name="submit-load")
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def accepted(self) -> list[str]:
        return [a.job_id for a in self.answers if a.status == 202 and a.job_id]

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set() and n < self.max_jobs:
            client = self.clients[n % len(self.clients)]
            self.answers.append(_submit(client, {**self.payload, "n": n}))
            n += 1
            self._stop.wait(self.period_s)


def _submit(client: httpx.Client, payload: dict[str, Any]) -> Answer:
    try:
        response = client.post(
            "/v1/jobs", json={"kind": "tracked", "payload": payload}, timeout=REQUEST_TIMEOUT_S
        )
    except httpx.TimeoutException as exc:
        return Answer(status=None, failure=f"timeout: {exc!r}")
    except httpx.TransportError as exc:
        return Answer(status=None, failure=f"transport: {exc!r}")
    try:
        body = response.json()
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    return Answer(
        status=response.status_code,
        error_type=error.get("type") if isinstance(error, dict) else None,
        retry_after=response.headers.get("retry-after"),
        job_id=body.get("id") if response.status_code == 202 else None,
    )


def assert_clean_answers(answers: list[Answer]) -> None:
    """Only 202s, and 503 ``unavailable`` with ``Retry-After``; no hung request."""
    bad = [
        a for a in answers
        if not (a.status == 202 or (a.status == 503 and a.error_type == "unavailable"
                                    and a.retry_after is not None and int(a.retry_after) >= 1))
    ]
    assert bad == [], bad


def probe_ready(url: str) -> int | None:
    """The status of ``/readyz`` (None when it did not answer in time)."""
    try:
        return httpx.get(f"{url}/readyz", timeout=REQUEST_TIMEOUT_S).status_code
    except httpx.TransportError:
        return None


def sleep_until(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))


def outage_under_load(
    url: str,
    clients: list[httpx.Client],
    *,
    stop: Callable[[], object],
    start: Callable[[], object],
    outage_s: float,
) -> SubmitLoad:
    """Submit steadily; take a backend down for ``outage_s`` (``/readyz`` must notice), bring
    it back, and keep submitting until new jobs are accepted again. Returns the load, whose
    answers are then checked by ``assert_clean_answers`` and the invariants."""
    from tests.e2e.harness import wait_until  # the harness imports nothing from here

    with SubmitLoad(clients=clients, payload={"seconds": 0.3}, period_s=0.1) as load:
        wait_until(lambda: len(load.accepted) >= 5)
        stop()
        back_at = time.monotonic() + outage_s
        wait_until(lambda: probe_ready(url) == 503, timeout=outage_s)
        sleep_until(back_at)
        start()
        wait_until(lambda: probe_ready(url) == 200, timeout=30)
        after = len(load.accepted)
        wait_until(lambda: len(load.accepted) >= after + 5, timeout=30)
    assert_clean_answers(load.answers)
    assert any(a.status == 503 for a in load.answers), "no request met the outage"
    return load
