"""The fleet's load: tenants of every tier submit short ``tracked`` jobs through both APIs,
and a sampler reads every tier's queue depth against its bound while they do."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

BURST = 6  # jobs a tenant submits back to back, then it pauses


@dataclass(frozen=True, kw_only=True)
class Answer:
    tenant: str
    status: int
    body: dict[str, Any]


@dataclass
class Tenant:
    """One tenant's submitter: round-robin over its clients (one per API)."""

    name: str
    tier: str
    clients: list[httpx.Client]
    jobs: int
    seed: int
    answers: list[Answer] = field(default_factory=list)

    def run(self, start: threading.Event) -> None:
        rng = random.Random(self.seed)
        start.wait()
        for n in range(self.jobs):
            seconds = round(rng.uniform(0.05, 0.3), 3)
            response = self.clients[n % len(self.clients)].post(
                "/v1/jobs", json={"kind": "tracked", "payload": {"seconds": seconds, "n": n}})
            self.answers.append(Answer(tenant=self.name, status=response.status_code,
                                       body=response.json()))
            if n % BURST == BURST - 1:
                threading.Event().wait(rng.uniform(0.8, 1.4))


@dataclass
class DepthSampler:
    """Reads ``/v1/queues`` from each API in turn until stopped: (tier, queued, bound)."""

    clients: list[httpx.Client]
    samples: list[tuple[str, int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        n = 0
        while not self._stop.is_set():
            body = self.clients[n % len(self.clients)].get("/v1/queues").json()
            self.samples += [(t["name"], t["queued"], t["bound"]) for t in body["tiers"]]
            n += 1
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()


def refusals_within_limits(answers: list[Answer]) -> list[Answer]:
    """The answers that break the contract: anything but a 202, or a 429 refused at its
    limit (``capacity`` with the tier at its bound, ``tenant_limit`` at the quota, or at the
    tenant's cap while its tier is at its bound and the pool has a free slot)."""
    bad = []
    for answer in answers:
        if answer.status == 202:
            continue
        error = answer.body.get("error", {}) if answer.status == 429 else {}
        at_bound = (error.get("type") == "capacity" and error.get("limit") == "bound"
                    and error["tier_queued"] >= error["bound"])
        at_quota = (error.get("type") == "tenant_limit" and error.get("limit") == "quota"
                    and error["tenant_queued"] >= error["quota"])
        at_cap = (error.get("type") == "tenant_limit" and error.get("limit") == "cap"
                  and error["tier_queued"] >= error["bound"]
                  and error["tenant_inflight"] >= error["tenant_cap"])
        if not (at_bound or at_quota or at_cap):
            bad.append(answer)
    return bad
