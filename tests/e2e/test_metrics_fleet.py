"""Two ``tierq api`` processes, a dispatcher and a worker on one PostgreSQL and one Redis:
after jobs ran through the whole system, both APIs' ``/metrics`` say the same, and count
every job once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import (
    System,
    free_port,
    started_system,
    wait_terminal,
    wait_until,
)
from tests.services import RedisServer

pytestmark = pytest.mark.e2e

# A fast pool: the free tier's quota lets a tenant queue all the jobs at once.
CONFIG = """
[policy]
pool_concurrency = 2
mean_service_s = 0.05
"""
JOBS = 8

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def system(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
) -> Iterator[System]:
    with started_system(tmp_path, config=CONFIG, concurrency=2, database_url=pg_url,
                        redis_url=redis_server.url, key_prefix=key_prefix) as sys_:
        yield sys_


def scrape(url: str) -> Samples:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_two_api_processes_report_the_same_fleet_figures(system: System) -> None:
    port = free_port()
    system.start("api-2", "api", "--host", "127.0.0.1", "--port", str(port))
    second = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{second}/readyz", timeout=2).status_code == 200)

    client = system.tenant("acme", "free")
    ids = [client.post("/v1/jobs", json={"kind": "echo", "payload": {"n": n}}).json()["id"]
           for n in range(JOBS)]
    assert all(wait_terminal(client, job_id)["status"] == "succeeded" for job_id in ids)
    # The leader's count of the live states follows within a reconciler period.
    wait_until(lambda: scrape(system.url).get(("tierq_jobs", (("pool", "default"),
                                                                     ("status", "queued"))))
               == 0.0, timeout=15)

    def agree() -> Samples | None:
        first = scrape(system.url)
        return first if scrape(second) == first else None

    samples = wait_until(agree, timeout=15)  # none of it moves once the jobs are done
    entered = {dict(labels)["status"]: value for (name, labels), value in samples.items()
               if name == "tierq_jobs_entered_total"}
    assert {status: entered[status] for status in
            ("queued", "dispatched", "running", "succeeded")} == dict.fromkeys(
        ("queued", "dispatched", "running", "succeeded"), JOBS)
    free = (("pool", "default"), ("tier", "free"))
    assert samples[("tierq_queue_wait_seconds_count", free)] == JOBS
    assert samples[("tierq_dispatch_latency_seconds_count", free)] == JOBS
    assert samples[("tierq_queue_wait_seconds_bucket", (("le", "+Inf"), *free))] == JOBS
    assert samples[("tierq_queue_depth", free)] == 0
    assert samples[("tierq_backend_up", (("backend", "redis"),))] == 1
