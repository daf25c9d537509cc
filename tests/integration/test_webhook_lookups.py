"""A webhook's name is looked up at submit with a bound on time and on what one tenant may
hold: a name whose DNS never answers, named by one tenant's submits all at once, takes the
API from no other tenant (the API served over real HTTP, the lookups' resolver the test's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from jobs.admission.webhooks import Lookups, lookups, resolved
from tests.integration.api_harness import ApiClient, auth

pytestmark = pytest.mark.integration

HANGS = "hangs.receiver.example"  # its DNS never answers (until the test ends)
SUBMITS = 40  # the API's thread pool: as many submits as it has threads


class NeverAnswers:
    """A resolver whose answer for ``HANGS`` never comes until ``released``; other names
    are the system's."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.lock = threading.Lock()
        self.waiting = 0
        self.most_at_once = 0

    def __call__(self, host: str) -> list[Any]:
        if host != HANGS:
            return resolved(host)
        with self.lock:
            self.waiting += 1
            self.most_at_once = max(self.most_at_once, self.waiting)
        try:
            self.released.wait(30)
            return []
        finally:
            with self.lock:
                self.waiting -= 1


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[NeverAnswers]:
    """This process's lookups (the API's) ask ``NeverAnswers`` while the test runs."""
    resolver = NeverAnswers()
    monkeypatch.setattr(lookups(), "resolve", resolver)
    yield resolver
    resolver.released.set()


def test_submits_naming_a_name_whose_dns_never_answers_hold_up_no_other_tenant(
    client: ApiClient, dns: NeverAnswers
) -> None:
    key, other = client.tenant_key("acme", "premium"), client.tenant_key("other")
    answered: list[int] = []

    def submit() -> None:
        with httpx.Client(base_url=client.base_url, timeout=60) as one:
            answered.append(one.post("/v1/jobs", headers=auth(key), json={
                "kind": "echo", "webhook": {"url": f"https://{HANGS}/hook"}}).status_code)

    submits = [threading.Thread(target=submit, daemon=True) for _ in range(SUBMITS)]
    for thread in submits:
        thread.start()
    try:
        # Every submit is either in its lookup or answered.
        deadline = time.monotonic() + 10
        while dns.waiting + len(answered) < SUBMITS:
            assert time.monotonic() < deadline, "the submits never got as far as the lookup"
            time.sleep(0.02)
        with httpx.Client(base_url=client.base_url, timeout=3) as another:
            try:
                queues = another.get("/v1/queues", headers=auth(other))
            except httpx.TimeoutException:
                pytest.fail(f"another tenant's GET /v1/queues: no answer within 3 s, "
                            f"{dns.waiting} of one tenant's lookups holding the API")
        assert queues.status_code == 200
        assert dns.most_at_once <= 2  # the tenant's share of lookups
    finally:
        dns.released.set()
        for thread in submits:
            thread.join(timeout=30)
    # A name not resolved in time is accepted (the deliverer checks it at every try); the
    # tenant's own limits decide the rest. Nothing failed.
    assert len(answered) == SUBMITS and set(answered) <= {202, 429}, answered
    assert 202 in answered


def test_a_lookup_that_times_out_or_finds_no_room_is_not_known_now() -> None:
    released = threading.Event()
    asked: list[str] = []

    def slow(host: str) -> list[Any]:
        asked.append(host)
        released.wait(10)
        return resolved("127.0.0.1")

    bounded = Lookups(slow, threads=3, per_tenant=2)
    try:
        assert bounded.addresses("a.example", owner="acme", timeout_s=0.05) is None
        assert bounded.addresses("b.example", owner="acme", timeout_s=0.05) is None
        # Both still run: the tenant's share is held until they return, not until its
        # submits stop waiting; another tenant's lookup takes the last thread.
        assert bounded.addresses("c.example", owner="acme", timeout_s=5) is None
        assert bounded.addresses("d.example", owner="other", timeout_s=0.05) is None
        assert bounded.addresses("e.example", owner="third", timeout_s=5) is None
        assert asked == ["a.example", "b.example", "d.example"]
    finally:
        released.set()
    deadline = time.monotonic() + 5
    while bounded.addresses("f.example", owner="acme", timeout_s=5) is None:
        assert time.monotonic() < deadline, "the shares were never given back"
        time.sleep(0.01)
