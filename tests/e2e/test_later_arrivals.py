"""End to end: what a lower tier is told under a premium stream that alone fills the pool,
against what it gets, with API, dispatcher and a Celery worker as separate processes on
PostgreSQL and Redis. Premium that arrives after a standard or free job goes first until
ageing lets that job pass it; the estimate counts that work (``policy.overtakers``), at the
tiers' arrival rates the leader measures."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import redis

from tests.e2e.harness import System, running, system_env, wait_terminal
from tests.services import RedisServer

# Timed against the clock it measures: alone, after the parallel part, on a quiet machine.
pytestmark = [pytest.mark.e2e, pytest.mark.alone, pytest.mark.timeout(240)]

SERVICE_S = 0.5  # each job sleeps this long; also the configured mean service time
SLOTS = 2  # μ = 4 jobs/s
AGEING_S = 0.2  # standard (10) passes fresh premium (0) after 2 s, free (20) after 4 s
PREMIUM_EVERY_S = 0.5  # per premium tenant, three of them: 6 jobs/s against μ = 4
WINDOW_S = 10.0  # policy.arrivals_window_s
PROBES = 6  # per tier, one a second


@pytest.fixture
def system(
    tmp_path: Path,
    pg_url: str,
    redis_server: RedisServer,
    key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
) -> Iterator[System]:
    config = tmp_path / "tierq.toml"
    config.write_text(f"[policy]\nmean_service_s = {SERVICE_S}\nageing_rate_s = {AGEING_S}\n"
                      f"arrivals_window_s = {WINDOW_S}\n")
    env = system_env(database_url=pg_url, redis_url=redis_server.url, key_prefix=key_prefix,
                     extra={"TIERQ_CONFIG": str(config)})
    with running(System(env=env, workdir=tmp_path)) as sys_:
        sys_.start_all(concurrency=SLOTS)
        yield sys_


def ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def stream(client: httpx.Client, stop: threading.Event, offset_s: float) -> None:
    """Premium jobs at a steady pace; refusals (its quota) are part of the stream."""
    start = time.monotonic() + offset_s
    sent = 0
    while not stop.is_set():
        time.sleep(max(0.0, start + sent * PREMIUM_EVERY_S - time.monotonic()))
        client.post("/v1/jobs", json={"kind": "sleep", "payload": {"seconds": SERVICE_S}})
        sent += 1


def test_lower_tiers_are_told_the_premium_work_that_will_pass_them(system: System) -> None:
    """Three premium tenants (cap 1 each, 5 queued each) keep the 2-slot pool full and its
    queue at their quotas, so premium is admitted at the rate the pool serves it. Once the
    leader has measured that rate over a whole window, one standard and one free job a
    second probe the queue, each from a tenant of its own: a standard job waits for the
    premium ahead of it and the premium that arrives in its first 2 s, a free job for its
    first 4 s (about 6 s and 8 s). For each tier, the median of ``|told - waited|`` is
    within max(1 s, 25 % of the median wait). Without the later arrivals both would be told
    about 4 s."""
    premium = [system.tenant(f"lux{i}", "premium") for i in range(3)]
    system.wait_for_capacity(premium[0], SLOTS)
    stop = threading.Event()
    senders = [threading.Thread(target=stream, args=(client, stop, i * PREMIUM_EVERY_S / 3),
                                daemon=True) for i, client in enumerate(premium)]
    for sender in senders:
        sender.start()
    told: dict[str, tuple[str, float, httpx.Client]] = {}
    try:
        time.sleep(WINDOW_S + 6)  # a whole window of the stream, measured by a refresh
        for i in range(PROBES):
            for tier in ("standard", "free"):
                client = system.tenant(f"{tier}{i}", tier)
                answer = client.post("/v1/jobs", json={"kind": "sleep",
                                                       "payload": {"seconds": SERVICE_S}})
                assert answer.status_code == 202, answer.text
                body = answer.json()
                assert body["estimated_wait_s"] is not None
                told[body["id"]] = (tier, body["estimated_wait_s"], client)
            time.sleep(1.0)
        waited: dict[str, float] = {}
        for job_id, (_, _, client) in told.items():
            done = wait_terminal(client, job_id, timeout=120)
            assert done["status"] == "succeeded", done
            waited[job_id] = ts(done["started_at"]) - ts(done["enqueued_at"])
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=10)

    for tier in ("standard", "free"):
        ids = [job_id for job_id, (of, _, _) in told.items() if of == tier]
        pairs = [(round(told[j][1], 2), round(waited[j], 2)) for j in ids]
        errors = [abs(told[j][1] - waited[j]) for j in ids]
        typical = statistics.median(waited[j] for j in ids)
        assert statistics.median(errors) <= max(1.0, 0.25 * typical), (tier, pairs)
        # The premium still to come is most of what they wait.
        assert typical > 1.5 * 4 * SERVICE_S / SLOTS, (tier, pairs)
