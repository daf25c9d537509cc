"""Webhooks end to end: API, dispatcher (whose deliverer posts them) and a Celery worker as
separate processes on PostgreSQL + Redis, and a receiver on loopback (the operator allows
private addresses here: ``TIERQ_WEBHOOK_ALLOW_PRIVATE``).

Each event arrives signed as the Standard Webhooks specification says, checked here with
the specification's algorithm written out (HMAC-SHA256 over ``id.timestamp.body`` with the
secret's base64-decoded bytes), not only the package's; a ``5xx`` is tried again under the
same ``webhook-id``; a batch reports its items and its end once; and a delivery still
pending when every process stops is made once the system runs again.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from standardwebhooks.webhooks import Webhook

from tests.e2e.harness import System, free_port, running, system_env, wait_terminal, wait_until
from tests.services import RedisServer
from tests.webhook_receiver import Receiver, signed_by

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = "[policy]\nmean_service_s = 0.5\n"


@pytest.fixture
def system(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
) -> Iterator[System]:
    (tmp_path / "tierq.toml").write_text(CONFIG)
    env = system_env(database_url=pg_url, redis_url=redis_server.url, key_prefix=key_prefix,
                     extra={"TIERQ_CONFIG": str(tmp_path / "tierq.toml"),
                            "TIERQ_WEBHOOK_ALLOW_PRIVATE": "true"})
    with running(System(env=env, workdir=tmp_path)) as deployment:
        yield deployment


def test_events_arrive_signed_and_a_5xx_is_tried_again_under_the_same_id(
    system: System,
) -> None:
    # The first try of each job.completed is answered 503, every other one 204.
    receiver = Receiver(free_port(), lambda got, tries: 503 if (
        got.event["type"] == "job.completed" and tries == 1) else 204)
    try:
        system.start_all(concurrency=2)
        acme = system.tenant("acme", "premium")
        secret = acme.get("/v1/webhooks/secret").json()["secret"]
        job = acme.post("/v1/jobs", json={"kind": "echo", "payload": {"x": 1}, "webhook": {
            "url": receiver.url, "events": ["started", "completed"]}}).json()
        wait_terminal(acme, job["id"])
        wait_until(lambda: len(receiver.of_type("job.completed")) == 2, timeout=30)
        (started,) = receiver.of_type("job.started")
        first, second = receiver.of_type("job.completed")
        assert first.id == second.id and first.id != started.id
        assert first.id.startswith("msg_") and second.at - first.at >= 3  # backed off
        for got in (started, first, second):
            assert signed_by(got, secret), got
            assert not signed_by(got, "whsec_" + base64.b64encode(b"x" * 24).decode())
            assert Webhook(secret).verify(got.body, {
                "webhook-id": got.id, "webhook-timestamp": got.timestamp,
                "webhook-signature": got.signature}) == got.event
            assert got.event["data"]["id"] == job["id"]
        assert second.event["data"]["status"] == "succeeded"
        assert second.event["data"]["result"] == {"x": 1}
        assert second.event["timestamp"].endswith("Z")

        def delivered() -> list[dict[str, Any]] | None:
            answer = acme.get(f"/v1/jobs/{job['id']}/deliveries")
            assert answer.status_code == 200, answer.text
            shown: list[dict[str, Any]] = answer.json()["deliveries"]
            return shown if all(d["status"] == "delivered" for d in shown) else None

        shown = wait_until(delivered)
        by_type = {d["type"]: d for d in shown}
        assert [a["status_code"] for a in by_type["job.completed"]["attempts"]] == [503, 204]
        assert by_type["job.completed"]["attempts"][0]["error"].startswith("HTTP 503")
        assert by_type["job.completed"]["webhook_id"] == first.id

        # A rotated secret: both sign for a day, so a receiver can switch over.
        new = acme.post("/v1/webhooks/secret/rotate").json()["secret"]
        other = acme.post("/v1/jobs", json={"kind": "echo", "payload": {}, "webhook": {
            "url": receiver.url}}).json()
        wait_terminal(acme, other["id"])
        wait_until(lambda: any(r.event["data"]["id"] == other["id"]
                               for r in receiver.of_type("job.completed")), timeout=30)
        last = next(r for r in receiver.of_type("job.completed")
                    if r.event["data"]["id"] == other["id"])
        assert signed_by(last, new) and signed_by(last, secret)
    finally:
        receiver.close()


def test_a_batch_reports_each_item_and_its_end_once(system: System) -> None:
    receiver = Receiver(free_port(), lambda got, tries: 200)
    try:
        system.start_all(concurrency=2)
        acme = system.tenant("acme", "premium")
        batch = acme.post("/v1/batches", json={
            "kind": "echo", "envelope": True,
            "items": [{"custom_id": f"q{i}", "payload": {"i": i}} for i in range(3)],
            "webhook": {"url": receiver.url, "events": ["completed", "item.completed"]},
        }).json()
        # Deliveries run side by side (webhook_tenant_concurrency), so the batch's end may
        # arrive before its last item's: wait for all four, then check each came once.
        wait_until(lambda: len(receiver.of_type("batch.completed")) == 1
                   and len(receiver.of_type("batch.item.completed")) >= 3, timeout=60)
        items = receiver.of_type("batch.item.completed")
        assert sorted(r.event["data"]["custom_id"] for r in items) == ["q0", "q1", "q2"]
        assert {r.event["data"]["batch_id"] for r in items} == {batch["id"]}
        (done,) = receiver.of_type("batch.completed")
        assert done.event["data"]["id"] == batch["id"]
        assert done.event["data"]["status"] == "finished"
        assert done.event["data"]["counts"]["succeeded"] == 3
        # One event was recorded for the batch's end, and it is the one delivered.
        def recorded() -> list[dict[str, Any]] | None:
            shown: list[dict[str, Any]] = acme.get(
                f"/v1/batches/{batch['id']}/deliveries").json()["deliveries"]
            return shown if all(d["status"] == "delivered" for d in shown) else None

        (only,) = wait_until(recorded)
        assert only["webhook_id"] == done.id
    finally:
        receiver.close()


def test_a_delivery_pending_when_everything_stops_is_made_after_it_starts_again(
    system: System,
) -> None:
    port = free_port()  # nothing listens there yet: the first try is refused
    system.start_all(concurrency=1)
    acme = system.tenant("acme", "premium")
    job = acme.post("/v1/jobs", json={"kind": "echo", "payload": {}, "webhook": {
        "url": f"http://127.0.0.1:{port}/hook"}}).json()
    wait_terminal(acme, job["id"])

    def failed_once() -> dict[str, Any] | None:
        shown = acme.get(f"/v1/jobs/{job['id']}/deliveries").json()["deliveries"]
        return shown[0] if shown and shown[0]["attempts"] else None

    pending = wait_until(failed_once, timeout=30)
    assert pending["status"] == "pending" and pending["attempts"][0]["status_code"] is None
    system.stop()
    receiver = Receiver(port, lambda got, tries: 204)
    try:
        system.start_all(concurrency=1)
        wait_until(lambda: receiver.of_type("job.completed"), timeout=60)
        (got,) = receiver.of_type("job.completed")
        assert got.id == pending["webhook_id"]
        admin_view = httpx.get(f"{system.url}/v1/jobs/{job['id']}/deliveries",
                               headers=acme.headers).json()["deliveries"][0]
        assert admin_view["status"] in ("pending", "delivered")
    finally:
        receiver.close()
