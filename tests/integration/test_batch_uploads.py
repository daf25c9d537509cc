"""Batch uploads from clients that send slowly or stall, over real HTTP on a real server.

Each upload here is written by hand on a socket, so the test decides when each byte goes: a
stalled upload is one whose head and first line were sent and whose end was not. Such an
upload holds no SQL write lock (SQLite's is the whole database's) and no thread of the API's
threadpool while it waits; a tenant has a bounded number of them in flight; and a body that
does not arrive in time is refused with nothing stored.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from jobs.core.states import Status
from jobs.process.settings import load_settings
from jobs.store import stats as stats_sql
from jobs.store.engine import SQLITE_BUSY_TIMEOUT_MS
from tests.integration.api_harness import ADMIN_KEY, ApiClient, auth, rt, running_api
from tests.services import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Threads of the API's threadpool (anyio's default limiter): more stalled uploads than this
# would leave no thread for anyone if each held one.
THREADPOOL = 40
# "Answered promptly": well below the symptoms (SQLite's busy timeout, a request that waits
# for a thread no one gives back).
PROMPT_S = 3.0


@contextlib.contextmanager
def api(db_url: str, redis_server: RedisServer, key_prefix: str, **api_settings: Any
        ) -> Iterator[ApiClient]:
    settings = load_settings(database_url=db_url, redis_url=redis_server.url,
                             key_prefix=key_prefix, admin_key=ADMIN_KEY,
                             policy={"pool_concurrency": 4}, api=api_settings)
    with running_api(settings) as client:
        yield client


def line(i: int) -> bytes:
    return json.dumps({"seconds": 0.01 * i}).encode() + b"\n"


class Upload:
    """One ``POST /v1/batches`` written by hand: NDJSON in chunked encoding, or JSON with a
    declared length, its head sent at once and its body as the test says."""

    def __init__(self, client: ApiClient, key: str, *, ndjson: bool = True,
                 length: int | None = None) -> None:
        url = urlsplit(str(client.base_url))
        assert url.hostname is not None and url.port is not None
        self.sock = socket.create_connection((url.hostname, url.port), timeout=30)
        self.chunked = ndjson
        target = "/v1/batches?kind=sleep" if ndjson else "/v1/batches"
        framing = ("Transfer-Encoding: chunked" if ndjson else f"Content-Length: {length}")
        kind = "application/x-ndjson" if ndjson else "application/json"
        head = (f"POST {target} HTTP/1.1\r\nHost: {url.hostname}\r\n"
                f"Authorization: Bearer {key}\r\nContent-Type: {kind}\r\n{framing}\r\n\r\n")
        self.sock.sendall(head.encode())

    def send(self, data: bytes) -> None:
        if self.chunked:
            data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
        self.sock.sendall(data)

    def finish(self, data: bytes = b"") -> None:
        if data:
            self.send(data)
        if self.chunked:
            self.sock.sendall(b"0\r\n\r\n")

    def answer(self, timeout_s: float = 30) -> tuple[int, dict[str, str], Any]:
        """The status, headers and JSON body of the server's answer."""
        self.sock.settimeout(timeout_s)
        response = http.client.HTTPResponse(self.sock, method="POST")
        response.begin()
        body = json.loads(response.read())
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def uploads() -> Iterator[list[Upload]]:
    """Uploads opened in the block, every socket closed after it (the server cannot stop
    while a request still waits for its body)."""
    opened: list[Upload] = []
    try:
        yield opened
    finally:
        for upload in opened:
            upload.close()


def wait_for_requests(client: ApiClient, before: set[Any], count: int) -> None:
    """Block until the server handles ``count`` requests that were not in ``before``, then
    give their handlers a moment to reach the body."""
    deadline = time.monotonic() + 30
    while len(client.in_flight() - before) < count:
        assert time.monotonic() < deadline, "the uploads never reached the server"
        time.sleep(0.01)
    time.sleep(0.5)


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def stored_items(client: ApiClient) -> int:
    with rt(client).sessions() as session:
        return stats_sql.count_by_status(session).get(Status.WAITING, 0)


def test_a_stalled_batch_upload_never_blocks_another_tenants_submit(
    sqlite_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    with api(sqlite_url, redis_server, key_prefix, batch_body_timeout_s=60) as client, \
            uploads() as opened:
        uploader = client.tenant_key("uploader")
        others = iter([client.tenant_key(f"other-{i}") for i in range(20)])  # a job each
        before = client.in_flight()
        upload = Upload(client, uploader)
        opened.append(upload)
        upload.send(line(0))
        wait_for_requests(client, before, 1)
        # The upload stays stalled past SQLite's busy timeout; other tenants' submits are
        # answered all along.
        stalled_since = time.monotonic()
        while time.monotonic() - stalled_since < SQLITE_BUSY_TIMEOUT_MS / 1000 + 1:
            submitted, took = timed(lambda: client.submit(next(others)))
            assert submitted.status_code == 202, submitted.text
            assert took < PROMPT_S
            time.sleep(0.5)
        upload.finish(line(1))
        status, _, body = upload.answer()
        assert status == 202, body
        assert body["total"] == 2
        assert stored_items(client) == 2


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_stalled_uploads_hold_no_thread_and_other_tenants_are_served(
    db_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    per_tenant = 4
    stalled = THREADPOOL + 8
    with api(db_url, redis_server, key_prefix, batch_body_timeout_s=60,
             max_concurrent_uploads_per_tenant=per_tenant) as client, uploads() as opened:
        keys = [client.tenant_key(f"uploader-{i}") for i in range(stalled // per_tenant)]
        reader = client.tenant_key("reader")
        before = client.in_flight()
        for key in keys:
            for _ in range(per_tenant):
                upload = Upload(client, key)
                opened.append(upload)
                upload.send(line(0))
        wait_for_requests(client, before, stalled)
        queues, took = timed(lambda: client.get("/v1/queues", headers=auth(reader),
                                                timeout=30))
        assert queues.status_code == 200, queues.text
        assert took < PROMPT_S
        submitted, took = timed(lambda: client.submit(reader))
        assert submitted.status_code == 202, submitted.text
        assert took < PROMPT_S
        for upload in opened:
            upload.finish(line(1))
        answers = [upload.answer() for upload in opened]
        assert [status for status, _, _ in answers] == [202] * stalled, answers[:3]
        assert stored_items(client) == 2 * stalled


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_tenant_over_its_concurrent_upload_bound_is_refused_with_tenant_limit(
    db_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    batch = {"kind": "sleep", "items": [{"seconds": 0}]}
    with api(db_url, redis_server, key_prefix, batch_body_timeout_s=60,
             max_concurrent_uploads_per_tenant=2) as client, uploads() as opened:
        key, other = client.tenant_key("bulk"), client.tenant_key("other")
        before = client.in_flight()
        for _ in range(2):
            opened.append(Upload(client, key))
            opened[-1].send(line(0))
        wait_for_requests(client, before, 2)

        refused = client.post("/v1/batches", json=batch, headers=auth(key))
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["type"] == "tenant_limit" and error["limit"] == "uploads"
        assert error["uploads"] == 2 and error["max_concurrent_uploads"] == 2
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.headers["X-Tier"] == "free" and "X-Queue-Position" in refused.headers
        as_ndjson = client.post("/v1/batches?kind=sleep", content=line(0),
                                headers={**auth(key), "Content-Type": "application/x-ndjson"})
        assert as_ndjson.status_code == 429
        assert as_ndjson.json()["error"]["limit"] == "uploads"
        # Another tenant has its own uploads.
        assert client.post("/v1/batches", json=batch, headers=auth(other)).status_code == 202

        for upload in opened:
            upload.finish(line(1))
            assert upload.answer()[0] == 202
        # Ended uploads give their slots back, refused ones too.
        for _ in range(3):
            bad = client.post("/v1/batches", json={"kind": "sleep", "items": [5]},
                              headers=auth(key))
            assert bad.status_code == 422
        accepted = client.post("/v1/batches", json=batch, headers=auth(key))
        assert accepted.status_code == 202, accepted.text
        # So does an upload whose client went away.
        before = client.in_flight()
        for _ in range(2):
            opened.append(Upload(client, key))
            opened[-1].send(line(0))
        wait_for_requests(client, before, 2)
        for upload in opened[-2:]:
            upload.close()
        deadline = time.monotonic() + 10
        while (status := client.post("/v1/batches", json=batch,
                                     headers=auth(key)).status_code) == 429:
            assert time.monotonic() < deadline, "the closed uploads kept their slots"
            time.sleep(0.1)
        assert status == 202


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_body_that_does_not_arrive_in_time_is_refused_and_stores_nothing(
    db_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    with api(db_url, redis_server, key_prefix, batch_body_timeout_s=1,
             max_concurrent_uploads_per_tenant=1) as client, uploads() as opened:
        key = client.tenant_key("slow")
        as_ndjson = Upload(client, key)
        opened.append(as_ndjson)
        as_ndjson.send(line(0) + line(1))
        as_json = Upload(client, client.tenant_key("slow-json"), ndjson=False, length=1000)
        opened.append(as_json)
        as_json.send(b'{"kind": "sleep", "items": [{"seconds": 0}, ')
        for upload in (as_ndjson, as_json):
            (status, headers, body), took = timed(lambda u=upload: u.answer(timeout_s=20))
            assert status == 408, body
            assert body["error"]["type"] == "invalid_request"
            assert "api.batch_body_timeout_s" in body["error"]["message"]
            assert headers.get("connection") == "close"
            assert took < 10
            assert upload.sock.recv(1) == b""  # the server closed the connection
        assert client.get("/v1/batches", headers=auth(key)).json()["batches"] == []
        assert stored_items(client) == 0
        # The timed-out upload gave its slot back: the tenant's next batch is taken.
        again = client.post("/v1/batches?kind=sleep", content=line(0),
                            headers={**auth(key), "Content-Type": "application/x-ndjson"})
        assert again.status_code == 202, again.text
