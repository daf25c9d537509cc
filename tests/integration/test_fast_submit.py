"""``POST /v1/jobs`` answered by ``jobs.api.fast_submit`` gives the route's own answers.

A tenant's first submit goes through FastAPI (its key is not cached yet); the next, the same
body, is answered by the fast path: both answers are compared. Every request the fast path
does not take (a body the model refuses, a query string, a body over the limit, a key to
look up) is still answered by FastAPI, as before. Over real HTTP, on real
PostgreSQL and Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from jobs.api.fast_submit import FastSubmit
from jobs.service.tenants import hash_key
from tests.integration.api_harness import ApiClient, auth

pytestmark = pytest.mark.integration


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """For each submit from now on: whether the fast path answered it."""
    seen: list[bool] = []
    original = FastSubmit._request

    def spied(self: FastSubmit, key: str, body: bytes) -> Any:
        found = original(self, key, body)
        seen.append(found is not None)
        return found

    monkeypatch.setattr(FastSubmit, "_request", spied)
    yield seen


def cached_key(client: ApiClient, name: str, tier: str) -> str:
    """A new tenant's key, once the API's tenant cache holds it (a read caches it, once the
    cache's listener is live): its submits can take the fast path."""
    key = client.tenant_key(name, tier)
    assert client.server is not None
    cache = client.server.config.app.state.tenant_cache
    deadline = time.monotonic() + 10
    while cache.get(hash_key(key)) is None:
        assert time.monotonic() < deadline, "the tenant never reached the cache"
        assert client.get("/v1/jobs", headers=auth(key)).status_code == 200
        time.sleep(0.05)
    return key


def _shape(response: httpx.Response) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """What a client sees, less what differs between two jobs (the id and where it is)."""
    body = response.json()
    job_id = body.pop("id", None)
    body.pop("queue_position", None)
    body.pop("estimated_wait_s", None)
    links = body.pop("links", None)
    headers = {name: response.headers.get(name) for name in ("content-type", "location")}
    if job_id is not None:
        assert links == {"self": f"/v1/jobs/{job_id}", "result": f"/v1/jobs/{job_id}/result"}
        assert headers["location"] == f"/v1/jobs/{job_id}"
        headers["location"] = "<the job>"
    return response.status_code, headers, body


def test_the_usual_submit_is_answered_as_the_route_answers_it(
    client: ApiClient, taken: list[bool]
) -> None:
    key = client.tenant_key("acme", "premium")
    body = {"kind": "sleep", "payload": {"seconds": 1}, "max_wait_s": 600, "max_attempts": 2}
    routed = client.submit(key, body)  # the key is looked up: FastAPI answers
    assert taken == [False]
    key = cached_key(client, "acme2", "premium")
    fast = client.submit(key, body)
    assert taken == [False, True]
    assert _shape(fast) == _shape(routed)
    assert _shape(fast)[:2] == (202, {"content-type": "application/json",
                                      "location": "<the job>"})
    job = client.get(fast.headers["location"], headers=auth(key)).json()
    assert (job["status"], job["max_attempts"], job["kind"]) == ("queued", 2, "sleep")


def test_a_refusal_is_answered_as_the_route_answers_it(
    client: ApiClient, taken: list[bool]
) -> None:
    key = cached_key(client, "free-one", "free")
    answers = [client.submit(key) for _ in range(40)]
    refused = [answer for answer in answers if answer.status_code == 429]
    assert refused and taken[-1]
    error = refused[-1].json()["error"]
    assert error["type"] in ("capacity", "tenant_limit")
    assert {"tier", "queue_position", "retry_after_seconds"} <= set(error)
    headers = refused[-1].headers
    assert headers["x-tier"] == "free" and int(headers["retry-after"]) >= 1
    assert int(headers["x-queue-position"]) == error["queue_position"]


@pytest.mark.parametrize(("send", "status", "type_"), [
    (lambda c, k: c.post("/v1/jobs", content=b"{not json", headers={
        **auth(k), "content-type": "application/json"}), 400, "invalid_request"),
    (lambda c, k: c.post("/v1/jobs", json={"kind": "sleep", "tier": "premium"},
                         headers=auth(k)), 422, "invalid_request"),
    (lambda c, k: c.post("/v1/jobs", json={"kind": ""}, headers=auth(k)), 422,
     "invalid_request"),
    (lambda c, k: c.post("/v1/jobs", params={"limt": 1}, json={"kind": "sleep"},
                         headers=auth(k)), 422, "invalid_request"),
    (lambda c, k: c.post("/v1/jobs", content=b'{"kind": "sleep"}',
                         headers={**auth(k), "content-type": "text/plain"}), 422,
     "invalid_request"),
    (lambda c, k: c.post("/v1/jobs", json={"kind": "sleep", "payload": {
        "x": "a" * 2_000_000}}, headers=auth(k)), 413, "payload_too_large"),
    (lambda c, k: c.post("/v1/jobs", json={"kind": "sleep"}, headers=auth("no-such-key")),
     401, "unauthorized"),
    (lambda c, k: c.post("/v1/jobs", json={"kind": "nope"}, headers=auth(k)), 422,
     "invalid_request"),
])
def test_what_the_fast_path_does_not_take_is_answered_by_the_route(
    client: ApiClient, taken: list[bool], send: Any, status: int, type_: str
) -> None:
    key = cached_key(client, "acme", "premium")
    answer = send(client, key)
    assert (answer.status_code, answer.json()["error"]["type"]) == (status, type_), answer.text


def test_a_keyed_submit_is_answered_as_the_route_answers_it(
    client: ApiClient, taken: list[bool]
) -> None:
    body = {"kind": "sleep", "payload": {"seconds": 1}, "idempotency_key": "run-7"}
    routed_key = client.tenant_key("acme", "premium")  # looked up: FastAPI answers
    routed = [client.submit(routed_key, body), client.submit(routed_key, body)]
    key = cached_key(client, "acme2", "premium")
    fast = [client.submit(key, body), client.submit(key, body)]
    assert taken[-2:] == [True, True]
    assert [_shape(answer) for answer in fast] == [_shape(answer) for answer in routed]
    assert [answer.status_code for answer in fast] == [202, 200]
    assert fast[0].json()["id"] == fast[1].json()["id"]
    other = client.submit(key, {**body, "payload": {"seconds": 2}})
    assert taken[-1] and other.status_code == 409, other.text
    error = other.json()["error"]
    assert (error["type"], error["job_id"]) == ("idempotency_conflict", fast[0].json()["id"])
    listed = client.get("/v1/jobs", headers=auth(key)).json()["jobs"]
    assert [job["id"] for job in listed] == [fast[0].json()["id"]]


def test_a_keyed_retry_gets_its_job_when_the_queue_refuses_new_work(
    client: ApiClient, taken: list[bool]
) -> None:
    key = cached_key(client, "free-two", "free")
    body = {"kind": "sleep", "payload": {"seconds": 1}, "idempotency_key": "first"}
    first = client.submit(key, body)
    assert first.status_code == 202, first.text
    answers = [client.submit(key) for _ in range(40)]  # past the tier's bound or the rate
    assert answers[-1].status_code == 429, answers[-1].text
    assert client.submit(key, {**body, "idempotency_key": "new"}).status_code == 429
    again = client.submit(key, body)
    assert taken[-1] and again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
