"""The client's webhook calls against the real API (PostgreSQL + Redis, served over HTTP):
the tenant's secret and its rotation, a submit that names a webhook, a job's and a batch's
deliveries, and one delivery made by the deliverer and checked with ``verify_webhook``."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jobs.api.webhook_bodies import render
from jobs.client import ApiError, AsyncClient, Client, Webhook, verify_webhook
from jobs.service.deliverer import Deliverer
from tests.integration.api_harness import ApiClient, Clock, make_settings, rt, running_api
from tests.services import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def api(
    pg_url: str, redis_server: RedisServer, key_prefix: str, clock: Clock, redis_client: Any
) -> Iterator[ApiClient]:
    """The API of the ``client`` fixture, allowed to call loopback receivers."""
    settings = make_settings(pg_url, redis_server.url, key_prefix).model_copy(
        update={"webhook_allow_private": True})
    with running_api(settings, clock) as served:
        yield served


def tenant_client(api: ApiClient, name: str = "acme") -> Client:
    return Client(str(api.base_url), api.tenant_key(name))


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps each POST's body and headers, answering 204."""

    def __init__(self) -> None:
        self.received: list[tuple[bytes, dict[str, str]]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                received.append((self.rfile.read(length), dict(self.headers.items())))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/tierq"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()
    thread.join(timeout=10)


def test_the_secret_is_stable_until_rotated(api: ApiClient) -> None:
    with tenant_client(api) as client:
        first = client.webhook_secret()
        assert first["secret"].startswith("whsec_")
        assert first["previous_valid_until"] is None
        assert client.webhook_secret() == first
        rotated = client.rotate_webhook_secret()
        assert rotated["secret"].startswith("whsec_")
        assert rotated["secret"] != first["secret"]
        assert rotated["previous_valid_until"] is not None
        assert client.webhook_secret() == rotated


def test_a_job_submitted_with_a_webhook_shows_it(api: ApiClient, receiver: Receiver) -> None:
    with tenant_client(api) as client:
        job = client.submit("echo", {"n": 1},
                            webhook=Webhook(url=receiver.url, events=("started", "completed")))
        hook = client.get(job["id"])["webhook"]
        assert hook["url"] == receiver.url
        assert sorted(hook["events"]) == ["completed", "started"]
        client.cancel(job["id"])  # the tenant's quota of queued jobs is 1 here
        plain = client.submit("echo", {"n": 2}, webhook={"url": receiver.url})
        assert client.get(plain["id"])["webhook"] == {"url": receiver.url,
                                                      "events": ["completed"]}
        client.cancel(plain["id"])
        assert client.get(client.submit("echo", {"n": 3})["id"])["webhook"] is None


def test_a_delivery_is_listed_and_verifies_with_the_secret(
    api: ApiClient, receiver: Receiver
) -> None:
    with tenant_client(api) as client:
        job = client.submit("echo", {"n": 1}, webhook={"url": receiver.url})
        assert client.deliveries(job["id"]) == {"deliveries": []}
        client.cancel(job["id"])  # a cancel before it started completes it
        (pending,) = client.deliveries(job["id"])["deliveries"]
        assert (pending["type"], pending["status"], pending["url"]) == (
            "job.completed", "pending", receiver.url)
        assert pending["attempts"] == []

        runtime = rt(api)
        assert Deliverer(runtime, functools.partial(render, runtime)).run_once() == 1
        (body, headers), = receiver.received
        event = verify_webhook(body, headers, client.webhook_secret()["secret"])
        assert event["type"] == "job.completed"
        assert event["data"]["id"] == job["id"]
        assert event["data"]["status"] == "cancelled"

        (delivered,) = client.deliveries(job["id"])["deliveries"]
        assert delivered["webhook_id"] == pending["webhook_id"] == headers["webhook-id"]
        assert delivered["status"] == "delivered"
        (attempt,) = delivered["attempts"]
        assert attempt["status_code"] == 204 and attempt["error"] is None


def test_a_batch_submitted_with_a_webhook_lists_its_deliveries(
    api: ApiClient, receiver: Receiver
) -> None:
    with tenant_client(api) as client:
        batch = client.submit_batch("echo", [{"n": 1}, {"n": 2}], webhook={
            "url": receiver.url, "events": ["completed", "item.completed"]})
        found = client.batch_deliveries(batch["id"])
        assert isinstance(found["deliveries"], list)
        client.cancel_batch(batch["id"])
        types = {d["type"] for d in client.batch_deliveries(batch["id"])["deliveries"]}
        assert types <= {"batch.completed"}


def test_the_async_client_has_the_same_calls(api: ApiClient, receiver: Receiver) -> None:
    key = api.tenant_key("acme")

    async def calls() -> tuple[dict[str, Any], ...]:
        async with AsyncClient(str(api.base_url), key) as client:
            secret = await client.webhook_secret()
            rotated = await client.rotate_webhook_secret()
            job = await client.submit("echo", {}, webhook={"url": receiver.url})
            batch = await client.submit_batch("echo", [{}], webhook=Webhook(url=receiver.url))
            return (secret, rotated, await client.get(job["id"]),
                    await client.deliveries(job["id"]),
                    await client.batch_deliveries(batch["id"]))

    secret, rotated, job, deliveries, batch_deliveries = asyncio.run(calls())
    assert rotated["secret"] != secret["secret"]
    assert job["webhook"]["url"] == receiver.url
    assert deliveries == {"deliveries": []}
    assert batch_deliveries == {"deliveries": []}


def test_a_loopback_webhook_is_refused_unless_allowed(
    client: ApiClient, tmp_path: Path
) -> None:
    """The ``client`` fixture's API has the default settings: no private addresses."""
    key = client.tenant_key("acme")
    with Client(str(client.base_url), key) as tierq:
        with pytest.raises(ApiError) as refused:
            tierq.submit("echo", {}, webhook={"url": "http://127.0.0.1:9/hook"})
        assert (refused.value.status, refused.value.type) == (422, "invalid_request")
        assert "webhook.url" in refused.value.message
        notes = tmp_path / "notes.txt"
        notes.write_text("some text to embed")
        with pytest.raises(ApiError) as refused_upload:
            tierq.upload(notes, webhook={"url": "http://[::1]:9/hook"})
        assert refused_upload.value.status == 422

    async def batch() -> None:
        async with AsyncClient(str(client.base_url), key) as tierq:
            await tierq.submit_batch("echo", [{}], webhook={"url": "http://localhost:9/hook"})

    with pytest.raises(ApiError) as refused_batch:
        asyncio.run(batch())
    assert refused_batch.value.status == 422


def test_a_document_uploaded_with_a_webhook_shows_it(
    api: ApiClient, receiver: Receiver, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("some text to embed")
    with tenant_client(api) as client:
        job = client.upload(notes, webhook=Webhook(url=receiver.url, events=("started",)))
        assert client.get(job["id"])["webhook"] == {"url": receiver.url, "events": ["started"]}
