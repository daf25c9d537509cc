"""The life of a job through the HTTP API: status and long-polls, results, cancels, lists.

State the API cannot reach by itself (a job dispatched, running, finished) is driven through
the index and the repository, the way the dispatcher and the workers drive it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobs.core.states import Status
from jobs.store import jobs as jobs_sql
from tests.integration.api_harness import (
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


