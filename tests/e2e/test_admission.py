"""End to end: what admission tells a client over real HTTP, with API, dispatcher and Celery
workers as separate processes; and the bound following the pool as workers come and go."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.e2e.harness import System, started_system, wait_status, wait_until
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# μ = slots / 2 s; with 2 slots: free bound 60, free quota floor(60 × 0.04) = 2, free cap 1.
CONFIG = "[policy]\nmean_service_s = 2.0\n"


@pytest.fixture
def system(
    tmp_path: Path,
    pg_url: str,
    redis_server: RedisServer,
    key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
) -> Iterator[System]:
    with started_system(tmp_path, config=CONFIG, concurrency=2, database_url=pg_url,
                        redis_url=redis_server.url, key_prefix=key_prefix) as sys_:
        yield sys_


def submit(client: httpx.Client, seconds: float = 0.0, **extra: Any) -> httpx.Response:
    return client.post("/v1/jobs", json={"kind": "sleep", "payload": {"seconds": seconds},
                                         **extra})


def check_429(answer: httpx.Response, type_: str, limit: str) -> dict[str, Any]:
    assert answer.status_code == 429, answer.text
    retry_after = answer.headers["retry-after"]
    assert retry_after.isdigit() and int(retry_after) >= 1
    assert answer.headers["x-queue-position"].isdigit()
    assert answer.headers["x-tier"] == "free"
    error: dict[str, Any] = answer.json()["error"]
    assert (error["type"], error["limit"], error["tier"]) == (type_, limit, "free")
    assert error["retry_after_seconds"] == int(retry_after)
    assert error["queue_position"] == int(answer.headers["x-queue-position"])
    return error


def free_tier(client: httpx.Client) -> dict[str, Any]:
    tiers = client.get("/v1/queues").json()["tiers"]
    found: dict[str, Any] = next(t for t in tiers if t["name"] == "free")
    return found


def test_every_answer_carries_its_numbers(system: System) -> None:
    acme, blocker = system.tenant("acme", "free"), system.tenant("blocker", "free")
    system.wait_for_capacity(acme, 2)
    # Both slots busy (a free tenant's cap is 1 slot): what follows has to wait.
    running_jobs = []
    for client in (acme, blocker):
        first = submit(client, 30)
        assert first.status_code == 202
        body = first.json()
        assert first.headers["location"] == f"/v1/jobs/{body['id']}"
        assert isinstance(body["queue_position"], int)
        assert isinstance(body["estimated_wait_s"], float)
        running_jobs.append((client, body["id"]))
    for client, job_id in running_jobs:
        wait_status(client, job_id, "running")

    # Next in line, no free slot: the pool serves one job in 1 s at μ = 1/s, but acme's own
    # slot (cap 1) frees only when its job finishes, about one service time, 2 s.
    queued = submit(acme)
    assert queued.status_code == 202
    assert (queued.json()["queue_position"], queued.json()["estimated_wait_s"]) == (0, 2.0)
    seen = acme.get(f"/v1/jobs/{queued.json()['id']}").json()
    assert (seen["status"], seen["queue_position"], seen["estimated_wait_s"]) == (
        "queued", 0, 2.0)

    # Its own deadline: one job ahead and no free slot, it would start in about 2 s.
    hurried = system.tenant("hurried", "free")
    refused = submit(hurried, max_wait_s=0.5)
    error = check_429(refused, "capacity", "deadline")
    assert error["message"] == ("tier 'free' would start this job in about 2 s, later than "
                                "its max_wait_s of 0.5 s")
    assert (refused.headers["retry-after"], refused.headers["x-queue-position"]) == ("2", "1")

    # Its quota: 2 queued jobs for a free tenant.
    assert submit(acme).status_code == 202
    error = check_429(submit(acme), "tenant_limit", "quota")
    assert error["message"] == "tenant 'acme' has 2 queued jobs, its limit is 2"

    # Its rate, set by the admin for this tenant only.
    with system.admin() as admin:
        tenants = admin.get("/v1/admin/tenants").json()["tenants"]
        hurried_id = next(t["id"] for t in tenants if t["name"] == "hurried")
        patched = admin.patch(f"/v1/admin/tenants/{hurried_id}",
                              json={"rate_per_s": 0.2, "rate_burst": 1})
        assert patched.status_code == 200
    assert submit(hurried).status_code == 202
    error = check_429(submit(hurried), "tenant_limit", "rate")
    assert error["message"] == "tenant 'hurried' is over its rate of 0.2 submits/s"
    assert 1 <= error["retry_after_seconds"] <= 5

    for client, job_id in running_jobs:
        client.post(f"/v1/jobs/{job_id}/cancel")


def test_the_bound_follows_the_pool_as_workers_join_and_leave(system: System) -> None:
    client = system.tenant("watcher", "free")
    system.wait_for_capacity(client, 2)
    assert free_tier(client)["bound"] == 60  # μ = 2 slots / 2 s
    assert client.get("/v1/queues").json()["pool"]["service_rate"] == 1.0

    extra = system.start("worker2", "worker", "--concurrency", "2")
    system.wait_for_capacity(client, 4)
    assert free_tier(client)["bound"] == 120
    assert client.get("/v1/queues").json()["pool"]["service_rate"] == 2.0

    extra.stop()  # SIGTERM: a clean stop takes its slots out at once
    wait_until(lambda: client.get("/v1/queues").json()["pool"]["capacity"] == 2)
    assert free_tier(client)["bound"] == 60
