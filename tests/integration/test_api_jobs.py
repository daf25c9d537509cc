"""The life of a job through the HTTP API: status and long-polls, results, cancels, lists.

State the API cannot reach by itself (a job dispatched, running, finished) is driven through
the index and the repository, the way the dispatcher and the workers drive it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobs.client.http import AsyncClient, Client, RetryPolicy
from jobs.core.states import Status
from jobs.store import jobs as jobs_sql
from tests.integration.api_harness import (
    ADMIN_KEY,
    ApiClient,
    Clock,
    auth,
    dispatch_one,
    make_settings,
    move,
    queue_of,
    rt,
    running_api,
)
from tests.services import RedisServer

pytestmark = pytest.mark.integration

# -- reading, long-polling, results ----------------------------------------------------------


def test_status_shows_the_live_queue_position(client: ApiClient, clock: Clock) -> None:
    first, second = client.tenant_key("first"), client.tenant_key("second")
    a = client.submit(first).json()["id"]
    clock.now += 1
    b = client.submit(second).json()["id"]
    view = client.get(f"/v1/jobs/{b}", headers=auth(second)).json()
    assert (view["status"], view["queue_position"], view["attempt"]) == ("queued", 1, 1)
    assert view["created_at"].endswith("Z") and view["dispatched_at"] is None
    client.post(f"/v1/jobs/{a}/cancel", headers=auth(first))
    view = client.get(f"/v1/jobs/{b}", headers=auth(second)).json()
    assert view["queue_position"] == 0
    dispatch_one(client, b)
    view = client.get(f"/v1/jobs/{b}", headers=auth(second)).json()
    assert (view["status"], view["queue_position"], view["estimated_wait_s"]) == (
        "dispatched", None, None)
    assert view["dispatched_at"] is not None


@pytest.fixture
def sqlite_client(
    sqlite_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[ApiClient]:
    with running_api(make_settings(sqlite_url, redis_server.url, key_prefix)) as api:
        yield api


def test_reading_a_queued_job_never_waits_for_a_writer_on_sqlite(
    sqlite_client: ApiClient, sqlite_url: str
) -> None:
    key = sqlite_client.tenant_key("reader")
    job_id = sqlite_client.submit(key).json()["id"]
    writer = sqlite3.connect(Path(sqlite_url.removeprefix("sqlite:///")), timeout=0)
    try:
        writer.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        view = sqlite_client.get(f"/v1/jobs/{job_id}", headers=auth(key))
        assert view.status_code == 200, view.text
        assert (view.json()["status"], view.json()["queue_position"]) == ("queued", 0)
    finally:
        writer.rollback()
        writer.close()


def test_long_poll_returns_the_new_status(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    job_id = client.submit(key).json()["id"]
    answers: list[httpx.Response] = []
    before = client.in_flight()
    poll = threading.Thread(target=lambda: answers.append(
        client.get(f"/v1/jobs/{job_id}", params={"wait": 10}, headers=auth(key))))
    poll.start()
    client.wait_for_new_request(before)
    dispatch_one(client, job_id)
    poll.join(timeout=60)
    assert answers[0].json()["status"] == "dispatched"
    # Unchanged: the call ends at its deadline with the same status.
    same = client.get(f"/v1/jobs/{job_id}", params={"wait": 0.3}, headers=auth(key))
    assert same.json()["status"] == "dispatched"
    # Terminal: nothing more can change, the call answers at once.
    move(client, job_id, Status.CANCELLED)
    done = client.get(f"/v1/jobs/{job_id}", params={"wait": 60}, headers=auth(key))
    assert done.json()["status"] == "cancelled"


def test_result_follows_the_job(client: ApiClient) -> None:
    key = client.tenant_key("acme", "premium")

    def new_job() -> str:
        job_id: str = client.submit(key, {"kind": "echo", "payload": {"x": 1}}).json()["id"]
        return job_id

    def result(job_id: str) -> httpx.Response:
        return client.get(f"/v1/jobs/{job_id}/result", headers=auth(key))

    job_id = new_job()
    pending = result(job_id)
    assert pending.status_code == 202 and pending.json()["status"] == "queued"
    assert 1 <= int(pending.headers["Retry-After"]) <= 5
    dispatch_one(client, job_id)
    move(client, job_id, Status.RUNNING)
    assert result(job_id).status_code == 202
    move(client, job_id, Status.SUCCEEDED, result={"x": 1})
    rt(client).index.release(job_id)
    done = result(job_id)
    assert (done.status_code, done.json()) == (
        200, {"id": job_id, "status": "succeeded", "result": {"x": 1}, "result_url": None,
              "result_bytes": None})

    failed = new_job()
    dispatch_one(client, failed)
    move(client, failed, Status.RUNNING, Status.FAILED, error="RuntimeError: boom")
    rt(client).index.release(failed)
    answer = result(failed)
    assert answer.status_code == 409
    assert answer.json()["error"]["type"] == "job_failed"
    assert answer.json()["error"]["job_error"] == "RuntimeError: boom"

    cancelled = new_job()
    client.post(f"/v1/jobs/{cancelled}/cancel", headers=auth(key))
    assert (result(cancelled).status_code, result(cancelled).json()["error"]["type"]) == (
        410, "job_cancelled")

    expired = new_job()
    rt(client).index.cancel(expired)
    move(client, expired, Status.EXPIRED)
    assert (result(expired).status_code, result(expired).json()["error"]["type"]) == (
        410, "job_expired")


# -- cancel ----------------------------------------------------------------------------------


def test_cancel_a_queued_job(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    job_id = client.submit(key).json()["id"]
    answer = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    assert answer.status_code == 200
    assert answer.json()["id"] == job_id and answer.json()["status"] == "cancelled"
    assert rt(client).index.position(job_id) is None
    assert queue_of(client, key, "free")["queued"] == 0
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    assert (again.status_code, again.json()["status"]) == (200, "cancelled")
    assert client.submit(key).status_code == 202  # its quota place is free again


def test_cancel_a_dispatched_job_releases_its_slot(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    job_id = client.submit(key).json()["id"]
    dispatch_one(client, job_id)
    assert rt(client).index.inflight() == 1
    answer = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    assert (answer.status_code, answer.json()["status"]) == (200, "cancelled")
    assert rt(client).index.inflight() == 0


def test_cancel_a_running_job_asks_its_handler(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    job_id = client.submit(key).json()["id"]
    dispatch_one(client, job_id)
    move(client, job_id, Status.RUNNING)
    answer = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    assert answer.status_code == 202
    assert answer.json() == {"id": job_id, "status": "running", "cancel_requested": True}
    with rt(client).sessions.begin() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None and job.cancel_requested and job.status is Status.RUNNING
    move(client, job_id, Status.SUCCEEDED, result=None)
    done = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    assert (done.status_code, done.json()["status"]) == (200, "succeeded")


# -- listing ---------------------------------------------------------------------------------


def test_list_pages_newest_first_and_filters_by_status(
    client: ApiClient, clock: Clock
) -> None:
    key = client.tenant_key("acme")
    ids = []
    for _ in range(5):  # the quota is 1 queued job: cancel each before the next
        job_id = client.submit(key).json()["id"]
        client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
        ids.append(job_id)
        clock.now += 1
    queued = client.submit(key).json()["id"]
    ids.append(queued)

    seen, cursor = [], None
    while True:
        params = {"limit": 4} | ({"cursor": cursor} if cursor else {})
        page = client.get("/v1/jobs", params=params, headers=auth(key)).json()
        seen += [job["id"] for job in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    only = client.get("/v1/jobs", params={"status": "queued"}, headers=auth(key)).json()
    assert [job["id"] for job in only["jobs"]] == [queued]
    assert only["jobs"][0]["queue_position"] == 0
    cancelled = client.get("/v1/jobs", params={"status": "cancelled", "limit": 500},
                           headers=auth(key)).json()
    assert len(cancelled["jobs"]) == 5 and cancelled["next_cursor"] is None




# -- retrying an ended job -------------------------------------------------------------------


def roomy_tenant(client: ApiClient) -> str:
    """A tenant's key whose quota holds every job these tests queue."""
    tenant = client.create_tenant("acme", "premium")
    answer = client.patch(f"/v1/admin/tenants/{tenant['id']}", json={"max_queued": 10},
                          headers=auth(ADMIN_KEY))
    assert answer.status_code == 200, answer.text
    key: str = tenant["api_key"]
    return key


def ended_job(client: ApiClient, key: str, payload: dict[str, Any]) -> str:
    """A job of this tenant that ended cancelled before it started: one a retry takes."""
    job_id = client.submit(key, {"kind": "echo", "payload": payload}).json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key)).status_code == 200
    return job_id


def jobs_of(client: ApiClient, key: str) -> list[dict[str, Any]]:
    page = client.get("/v1/jobs", params={"limit": 500}, headers=auth(key)).json()
    jobs: list[dict[str, Any]] = page["jobs"]
    return jobs


def test_a_retry_with_the_same_idempotency_key_makes_one_job(client: ApiClient) -> None:
    key = roomy_tenant(client)
    first, other = ended_job(client, key, {"n": 1}), ended_job(client, key, {"n": 2})
    keyed = auth(key) | {"Idempotency-Key": "retry-7"}

    made = client.post(f"/v1/jobs/{first}/retry", headers=keyed)
    again = client.post(f"/v1/jobs/{first}/retry", headers=keyed)

    assert (made.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == made.json()["id"]
    assert again.headers["Location"] == f"/v1/jobs/{made.json()['id']}"
    assert [job["retry_of"] for job in jobs_of(client, key)].count(first) == 1
    # The key is the retry's: another job's retry, or a submit of the same work, is a conflict.
    for reused in (client.post(f"/v1/jobs/{other}/retry", headers=keyed),
                   client.submit(key, {"kind": "echo", "payload": {"n": 1},
                                       "idempotency_key": "retry-7"})):
        assert reused.status_code == 409, reused.text
        assert reused.json()["error"]["type"] == "idempotency_conflict"
    too_long = client.post(f"/v1/jobs/{first}/retry",
                           headers=auth(key) | {"Idempotency-Key": "k" * 201})
    assert too_long.status_code == 422
    assert "Idempotency-Key" in too_long.text
    assert len(jobs_of(client, key)) == 3


class LosesFirstAnswer(httpx.BaseTransport):
    """Sends each request, but loses the answer to the first of ``path_end``'s after the
    server has handled it, as a connection cut on the way back would."""

    def __init__(self, path_end: str) -> None:
        self._inner = httpx.HTTPTransport()
        self._path_end = path_end
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        if request.url.path.endswith(self._path_end) and not self.lost:
            response.read()
            response.close()
            self.lost += 1
            raise httpx.ReadError("connection reset by peer", request=request)
        return response

    def close(self) -> None:
        self._inner.close()


class LosesFirstAnswerAsync(httpx.AsyncBaseTransport):
    """``LosesFirstAnswer`` for the async client."""

    def __init__(self, path_end: str) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._path_end = path_end
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if request.url.path.endswith(self._path_end) and not self.lost:
            await response.aread()
            await response.aclose()
            self.lost += 1
            raise httpx.ReadError("connection reset by peer", request=request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def test_a_client_retry_resent_after_a_lost_answer_makes_one_job(client: ApiClient) -> None:
    key = roomy_tenant(client)
    first, second = ended_job(client, key, {"n": 1}), ended_job(client, key, {"n": 2})
    policy = RetryPolicy(attempts=3, backoff_s=0.01, jitter=0.0)
    base = str(client.base_url)
    lossy = LosesFirstAnswer("/retry")
    with Client(base, key, retry=policy, transport=lossy) as sync_client:
        made = sync_client.retry(first)
    assert lossy.lost == 1

    async def retry_async() -> tuple[dict[str, Any], int]:
        lossy = LosesFirstAnswerAsync("/retry")
        async with AsyncClient(base, key, retry=policy, transport=lossy) as async_client:
            return await async_client.retry(second), lossy.lost

    made_async, lost = asyncio.run(retry_async())
    assert lost == 1
    retries = [job for job in jobs_of(client, key) if job["retry_of"] is not None]
    assert sorted(job["id"] for job in retries) == sorted([made["id"], made_async["id"]])
    assert {job["retry_of"] for job in retries} == {first, second}
