"""The chaos soak's clients: tenants of every tier submitting ``tracked`` jobs, some cancelled,
a few whose error or result holds U+0000.

Each tenant's thread submits bursts at random intervals. Every submission carries its own
idempotency key and is retried with that key after a 503, a timeout or a dropped connection,
so a job is never submitted twice however the API fails; a 429 is a refusal, never an
accepted job. The clients record what each submission was answered, so the test knows
exactly which job ids were accepted (202, or 200 for a retry that found its job), which were
refused, and which it may never know (it gave up while the API was unreachable).
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.faults.report import clock_text

REQUEST_TIMEOUT_S = 10.0
# A submission or a cancel is retried this long at most, then given up.
GIVE_UP_S = 30.0
CANCEL_SHARE = 0.12
# Answers the API may give under faults; any other is reported.
EXPECTED = frozenset({200, 202, 429, 503})
DEADLINE_SHARE = 0.25
# Of the submissions, this share raises an error holding U+0000 and as many return a result
# holding it (PostgreSQL stores neither as it is).
NUL_SHARE = 0.03
# Submissions of the second pool's kind (``tracked.gpu``, its own workers and caps).
GPU_SHARE = 0.25
# Of the jobs, those with a webhook (``job.completed``) to the soak's receiver.
WEBHOOK_SHARE = 0.3


@dataclass(frozen=True, kw_only=True)
class TenantLoad:
    name: str
    tier: str
    api_key: str
    mean_gap_s: float  # between bursts


@dataclass
class Submission:
    """One job a client meant to submit once, under one idempotency key."""

    key: str
    tenant: str
    body: dict[str, Any]
    job_id: str | None = None  # answered 202, or 200 with the job this key made
    refused: bool = False  # answered 429
    unsure: bool = False  # some try went unanswered, or was a 503: it may have landed
    answers: list[str] = field(default_factory=list)


@dataclass
class ChaosLoad:
    """Submitting threads (one per tenant) and a cancelling thread, until ``stop``."""

    url: str
    tenants: list[TenantLoad]
    seed: int
    webhook_url: str | None = None  # where a share of the jobs ask their end to be posted
    submissions: list[Submission] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)  # one line per cancel, with its answer
    anomalies: list[str] = field(default_factory=list)  # answers the API must never give
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _due: list[tuple[float, str, str]] = field(default_factory=list)  # (at, job, api key)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for n, tenant in enumerate(self.tenants):
            rng = random.Random(self.seed * 1000 + n)
            self._threads.append(threading.Thread(
                target=self._submit_loop, args=(tenant, rng), name=f"load-{tenant.name}"))
        self._threads.append(threading.Thread(target=self._cancel_loop, name="load-cancel"))
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop submitting; pending cancels are still sent (each bounded)."""
        self._stop.set()
        for thread in self._threads:
            thread.join()

    @property
    def accepted(self) -> list[str]:
        return [s.job_id for s in self.submissions if s.job_id is not None]

    def summary(self) -> str:
        subs = self.submissions
        return (
            f"load: {len(subs)} submissions, {len(self.accepted)} accepted, "
            f"{sum(s.refused for s in subs)} refused (429), "
            f"{sum(s.job_id is None and not s.refused for s in subs)} unanswered, "
            f"{sum(s.unsure for s in subs)} retried after a 503 or no answer, "
            f"{len(self.cancels)} cancels sent"
        )

    # -- submitting ----------------------------------------------------------------------

    def _submit_loop(self, tenant: TenantLoad, rng: random.Random) -> None:
        headers = {"Authorization": f"Bearer {tenant.api_key}"}
        n = 0
        with httpx.Client(base_url=self.url, headers=headers,
                          timeout=REQUEST_TIMEOUT_S) as client:
            while not self._stop.wait(rng.expovariate(1 / tenant.mean_gap_s)):
                for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
                    if self._stop.is_set():
                        break
                    n += 1
                    submission = self._submission(tenant, n, rng, self.webhook_url)
                    with self._lock:
                        self.submissions.append(submission)
                    self._submit(client, submission)
                    if submission.job_id is not None and rng.random() < CANCEL_SHARE:
                        self._cancel_later(submission.job_id, tenant.api_key, rng)

    @staticmethod
    def _submission(tenant: TenantLoad, n: int, rng: random.Random,
                    webhook_url: str | None) -> Submission:
        body: dict[str, Any] = {
            "kind": "tracked",
            "payload": {"seconds": round(rng.uniform(0, 1.5), 3), "n": n},
            "idempotency_key": f"{tenant.name}-{n}",
            "max_attempts": rng.choice((2, 3, 3, 5)),
        }
        pick = rng.random()
        if pick < NUL_SHARE:  # a handler whose error holds U+0000
            body["payload"]["nul"] = True
        elif pick < 2 * NUL_SHARE:  # a result holding U+0000
            body.update(kind="nul-result", payload={"n": n})
        elif rng.random() < GPU_SHARE:
            body["kind"] = "tracked.gpu"
        if rng.random() < DEADLINE_SHARE:
            body["max_wait_s"] = round(rng.uniform(2, 15), 1)
        if webhook_url is not None and rng.random() < WEBHOOK_SHARE:
            body["webhook"] = {"url": webhook_url}
        return Submission(key=body["idempotency_key"], tenant=tenant.name, body=body)

    def _submit(self, client: httpx.Client, submission: Submission) -> None:
        give_up = time.monotonic() + GIVE_UP_S
        while time.monotonic() < give_up:
            answer, wait_s = self._try(client, "POST", "/v1/jobs", submission.body)
            submission.answers.append(answer.text)
            if answer.status in (200, 202):
                submission.job_id = str(answer.body["id"])
                return
            if answer.status == 429:
                submission.refused = True
                return
            if answer.status is not None and answer.status < 500:
                return  # rejected outright: recorded as an anomaly, nothing was accepted
            submission.unsure = True
            time.sleep(wait_s)

    # -- cancelling ----------------------------------------------------------------------

    def _cancel_later(self, job_id: str, api_key: str, rng: random.Random) -> None:
        with self._lock:
            heapq.heappush(self._due, (time.monotonic() + rng.uniform(0, 2), job_id, api_key))

    def _cancel_loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as client:
            while True:
                with self._lock:
                    ready = bool(self._due) and self._due[0][0] <= time.monotonic()
                    item = heapq.heappop(self._due) if ready else None
                    idle = not self._due
                if item is None:
                    if idle and self._stop.is_set():
                        return
                    time.sleep(0.05)
                    continue
                self._cancel(client, item[1], item[2])

    def _cancel(self, client: httpx.Client, job_id: str, api_key: str) -> None:
        headers = {"Authorization": f"Bearer {api_key}"}
        give_up = time.monotonic() + GIVE_UP_S / 2
        while time.monotonic() < give_up:
            answer, wait_s = self._try(client, "POST", f"/v1/jobs/{job_id}/cancel", None,
                                       headers)
            if answer.status is not None and answer.status < 500:
                self.cancels.append(f"{clock_text(time.time())} {job_id} {answer.text}")
                return
            time.sleep(wait_s)
        self.cancels.append(f"{clock_text(time.time())} {job_id} gave up")

    # -- one request ---------------------------------------------------------------------

    def _try(
        self, client: httpx.Client, method: str, path: str, body: dict[str, Any] | None,
        headers: dict[str, str] | None = None,
    ) -> tuple[_Answer, float]:
        """One request; its answer and how long to wait before a retry."""
        try:
            response = client.request(method, path, json=body, headers=headers)
        except httpx.TransportError as exc:
            return _Answer(status=None, text=type(exc).__name__, body={}), 0.5
        try:
            parsed = response.json()
        except ValueError:
            parsed = {}
        answer = _Answer(status=response.status_code, text=str(response.status_code),
                         body=parsed if isinstance(parsed, dict) else {})
        if response.status_code not in EXPECTED:
            self.anomalies.append(
                f"{clock_text(time.time())} {method} {path}: {response.status_code} "
                f"{response.text[:300]}")
        retry_after = response.headers.get("retry-after", "")
        wait_s = min(2.0, float(retry_after)) if retry_after.isdigit() else 0.5
        return answer, wait_s


@dataclass(frozen=True, kw_only=True)
class _Answer:
    status: int | None  # None: no answer (timeout, connection refused or dropped)
    text: str
    body: dict[str, Any]
