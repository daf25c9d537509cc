"""End to end: API, dispatcher and Celery worker as separate processes on PostgreSQL + Redis.

The tests of the broker's path run once on each broker (Redis, RabbitMQ): submit → dispatch
→ run → result, cancels (queued and running), a failed job, caps across workers, one queue
per tier, a killed worker's job recovered by its lease, and a freed slot's next job reaching
its worker with the dispatcher stopped. Ageing and the bound are decided
by the dispatcher and the API before any message exists: they run on Redis only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from jobs.index.redis_index import RedisIndex
from tests.e2e.conftest import BROKERS
from tests.e2e.harness import (
    Broker,
    Process,
    System,
    free_port,
    max_overlap,
    running,
    system_env,
    wait_status,
    wait_terminal,
    wait_until,
)
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
both_brokers = pytest.mark.parametrize("broker", BROKERS, indirect=True)


@pytest.fixture
def deployment(
    tmp_path: Path,
    pg_url: str,
    redis_server: RedisServer,
    key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
    broker: Broker,  # deletes this test's RabbitMQ queues afterwards
) -> Callable[[str], System]:
    """A not yet started System on this test's database, prefix and broker, with a TOML
    config."""

    def build(config: str) -> System:
        path = tmp_path / "tierq.toml"
        path.write_text(config)
        broker.own(key_prefix, config)
        env = system_env(
            database_url=pg_url,
            redis_url=redis_server.url,
            key_prefix=key_prefix,
            extra={"TIERQ_CONFIG": str(path), **broker.env},
        )
        return System(env=env, workdir=tmp_path)

    return build


@pytest.fixture
def system(deployment: Callable[[str], System]) -> Iterator[System]:
    # Capacity comes from the live worker's registration (no pool_concurrency configured).
    with running(deployment("[policy]\nmean_service_s = 0.5\n")) as sys_:
        sys_.start_all(concurrency=2)
        yield sys_


def ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def submit(
    client: httpx.Client, kind: str, payload: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    response = client.post("/v1/jobs", json={"kind": kind, "payload": payload, **extra})
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    return body


@both_brokers
def test_submit_poll_result_and_tenant_isolation(system: System) -> None:
    acme = system.tenant("acme", "premium")
    other = system.tenant("other", "free")
    system.wait_for_capacity(acme, 2)

    response = acme.post(
        "/v1/jobs", json={"kind": "echo", "payload": {"a": 1}, "idempotency_key": "k1"}
    )
    assert response.status_code == 202
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["tier"] == "premium"

    again = acme.post(
        "/v1/jobs", json={"kind": "echo", "payload": {"a": 1}, "idempotency_key": "k1"}
    )
    assert again.status_code == 200
    assert again.json()["id"] == job["id"]

    assert other.get(f"/v1/jobs/{job['id']}").status_code == 404
    assert other.get(f"/v1/jobs/{job['id']}/result").status_code == 404

    final = wait_terminal(acme, job["id"])
    assert final["status"] == "succeeded"
    assert final["attempt"] == 1
    result = acme.get(f"/v1/jobs/{job['id']}/result")
    assert result.status_code == 200
    assert result.json()["result"] == {"a": 1}
    listed = acme.get("/v1/jobs").json()["jobs"]
    assert [j["id"] for j in listed] == [job["id"]]  # the idempotent resubmit made no job


@both_brokers
def test_cancelled_and_expired_jobs_never_start_and_failures_are_409(system: System) -> None:
    acme = system.tenant("acme", "premium")
    system.wait_for_capacity(acme, 2)
    # Fill both slots (premium cap is 1 per tenant on a 2-slot pool: use two tenants).
    blocker_tenant = system.tenant("blocker", "premium")
    blockers = [submit(c, "sleep", {"seconds": 3}) for c in (acme, blocker_tenant)]
    for job, client in zip(blockers, (acme, blocker_tenant), strict=True):
        wait_status(client, job["id"], "running")

    waiting = submit(acme, "echo", {"x": 1})
    cancel = acme.post(f"/v1/jobs/{waiting['id']}/cancel")
    assert cancel.status_code == 200
    assert cancel.json()["status"] == "cancelled"

    doomed = submit(acme, "echo", {"x": 2}, max_wait_s=0.5)
    expired = wait_terminal(acme, doomed["id"])
    assert expired["status"] == "expired"
    assert expired["started_at"] is None
    assert acme.get(f"/v1/jobs/{doomed['id']}/result").json()["error"]["type"] == "job_expired"

    failing = submit(blocker_tenant, "sleep", {"seconds": 0, "fail": True})
    assert wait_terminal(blocker_tenant, failing["id"])["status"] == "failed"
    result = blocker_tenant.get(f"/v1/jobs/{failing['id']}/result")
    assert result.status_code == 409
    assert result.json()["error"]["type"] == "job_failed"

    for job, client in zip(blockers, (acme, blocker_tenant), strict=True):
        assert wait_terminal(client, job["id"])["status"] == "succeeded"
    cancelled = acme.get(f"/v1/jobs/{waiting['id']}").json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["started_at"] is None
    assert acme.get(f"/v1/jobs/{waiting['id']}/result").status_code == 410


@both_brokers
def test_a_running_job_is_cancelled_and_its_slot_comes_back(system: System) -> None:
    acme = system.tenant("acme", "premium")  # cap: max(1, floor(2 × 0.25)) = 1
    system.wait_for_capacity(acme, 2)
    long = submit(acme, "sleep", {"seconds": 60})
    wait_status(acme, long["id"], "running")

    response = acme.post(f"/v1/jobs/{long['id']}/cancel")
    assert response.status_code == 202, response.text
    assert response.json()["cancel_requested"] is True
    final = wait_terminal(acme, long["id"], timeout=30)  # long before its 60 s are up
    assert final["status"] == "cancelled"
    assert final["started_at"] is not None
    assert acme.get(f"/v1/jobs/{long['id']}/result").json()["error"]["type"] == "job_cancelled"
    # The tenant's only slot is free again: its next job runs.
    after = submit(acme, "echo", {"after": True})
    assert wait_terminal(acme, after["id"])["status"] == "succeeded"


TIERS_CONFIG = """
[policy]
pool_concurrency = 3
mean_service_s = 0.5
"""


def broker_depths(broker: Broker, key_prefix: str, redis_client: redis.Redis) -> dict[str, int]:
    """Messages waiting in each tier's broker queue, read from the broker itself."""
    names = broker.names(key_prefix)
    depths = {}
    for tier in ("premium", "standard", "free"):
        if names is None:  # Redis: the queue is a list under the key prefix
            depths[tier] = int(redis_client.llen(f"{key_prefix}tier.{tier}"))
        else:
            assert broker.rabbit is not None
            depths[tier] = broker.rabbit.queue_depth(names.queue(tier)) or 0
    return depths


@both_brokers
def test_each_tier_has_its_own_queue_under_the_deployments_prefix(
    deployment: Callable[[str], System], broker: Broker, key_prefix: str,
    redis_client: redis.Redis,
) -> None:
    with running(deployment(TIERS_CONFIG)) as system:
        system.start_api()
        system.start("dispatcher", "dispatcher")
        clients = {tier: system.tenant(f"t-{tier}", tier) for tier in ("premium", "standard",
                                                                          "free")}
        # A worker's registration whose consumer has not started yet: the dispatcher leases
        # into its live slots (none into slots no live worker brings).
        RedisIndex(redis_client, key_prefix).register_worker("starting@host", slots=3,
                                                              ttl_s=60.0)
        jobs = {tier: submit(client, "echo", {"tier": tier}) for tier, client in clients.items()}
        # Each job waits, published, in its own tier's queue.
        wait_until(lambda: broker_depths(broker, key_prefix, redis_client)
                   == {"premium": 1, "standard": 1, "free": 1})
        system.start("worker", "worker", "--concurrency", "3")
        for tier, job in jobs.items():
            final = wait_terminal(clients[tier], job["id"])
            assert (final["status"], final["tier"]) == ("succeeded", tier)
        assert broker_depths(broker, key_prefix, redis_client) == {
            "premium": 0, "standard": 0, "free": 0}


LEASE_CONFIG = """
[policy]
lease_ttl_s = 2
mean_service_s = 0.5
"""


@both_brokers
def test_a_killed_workers_job_runs_again_by_its_lease_not_the_broker(
    deployment: Callable[[str], System],
) -> None:
    with running(deployment(LEASE_CONFIG)) as system:
        system.start_api()
        system.start("dispatcher", "dispatcher")
        first = system.start("worker-1", "worker", "--concurrency", "1")
        client = system.tenant("acme", "premium")
        system.wait_for_capacity(client, 1)
        job = submit(client, "sleep", {"seconds": 2})
        wait_status(client, job["id"], "running")
        first.kill()  # SIGKILL mid-job: its message was acked when the job started
        system.start("worker-2", "worker", "--concurrency", "1")
        final = wait_terminal(client, job["id"], timeout=60)
        result = client.get(f"/v1/jobs/{job['id']}/result")

    # Run again as a new attempt once the lease lapsed (a redelivered message would have
    # been attempt 1 again, and stale).
    assert (final["status"], final["attempt"]) == ("succeeded", 2)
    assert result.json()["result"] == {"slept": 2}


@both_brokers
def test_flower_sees_the_workers_and_their_tasks(system: System) -> None:
    """Flower needs no management API on RabbitMQ: it finds workers through the control
    exchange and tasks through the event exchange, both the deployment's own."""
    port = free_port()
    system.start("flower", "flower", "--port", str(port),
                 env={"FLOWER_UNAUTHENTICATED_API": "true"})
    flower = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    system.clients.append(flower)
    workers = wait_until(lambda: flower.get("/api/workers", params={"refresh": 1}).json())
    assert [name.startswith("tierq-") for name in workers] == [True]

    acme = system.tenant("acme", "premium")
    system.wait_for_capacity(acme, 2)

    def tasks_of(job_id: str) -> list[dict[str, Any]]:
        return [task for task in flower.get("/api/tasks").json().values()
                if job_id in str(task.get("args"))]

    def seen_by_flower() -> list[dict[str, Any]]:
        """Run a job; Flower's record of its task, if any. Flower turns task events on in
        the workers a few seconds after it starts (its periodic ``enable_events``)."""
        job = submit(acme, "echo", {"seen": True})
        assert wait_terminal(acme, job["id"])["status"] == "succeeded"
        time.sleep(0.5)  # the task's events travel through the broker to Flower
        return tasks_of(job["id"])

    tasks = wait_until(seen_by_flower, timeout=30, every=0.5)
    assert tasks[0]["name"] == "tierq.run_job" and tasks[0]["state"] == "SUCCESS"

    # A job that a freed slot takes next (handed to the worker's own consumer, never through
    # a dispatcher round) is a task Flower sees as well.
    busy = [submit(acme, "sleep", {"seconds": 1}) for _ in range(2)]
    for job in busy:
        wait_status(acme, job["id"], "running")
    handed = submit(acme, "echo", {"handed": True})
    assert wait_terminal(acme, handed["id"])["status"] == "succeeded"
    tasks = wait_until(lambda: [task for task in tasks_of(handed["id"])
                                if task["state"] == "SUCCESS"], timeout=10, every=0.5)
    assert tasks[0]["name"] == "tierq.run_job"


NOISY_CONFIG = """
[policy]
pool_concurrency = 4
mean_service_s = 0.5
[tiers.standard]
base_priority = 10
max_wait_s = 60
tenant_share = 0.5
"""


@both_brokers
def test_noisy_neighbour_cannot_take_the_tier(deployment: Callable[[str], System]) -> None:
    with running(deployment(NOISY_CONFIG)) as system:
        system.start_all(concurrency=4)
        noisy, quiet = system.tenant("noisy", "standard"), system.tenant("quiet", "standard")
        noisy_jobs = [submit(noisy, "sleep", {"seconds": 0.4}) for _ in range(10)]
        wait_status(noisy, noisy_jobs[0]["id"], "running")
        quiet_job = submit(quiet, "sleep", {"seconds": 0.1})

        finished = [wait_terminal(noisy, j["id"]) for j in noisy_jobs]
        quiet_final = wait_terminal(quiet, quiet_job["id"])

    assert {j["status"] for j in finished} == {"succeeded"}
    assert quiet_final["status"] == "succeeded"
    intervals = [(ts(j["started_at"]), ts(j["finished_at"])) for j in finished]
    assert max_overlap(intervals) <= 2  # cap = floor(4 × 0.5)
    # The quiet tenant did not queue behind the noisy backlog.
    assert ts(quiet_final["started_at"]) < max(start for start, _ in intervals)


AGEING_RATE = 0.02
AGEING_CONFIG = f"""
[policy]
ageing_rate_s = {AGEING_RATE}
pool_concurrency = 2
mean_service_s = 0.2
[tiers.premium]
base_priority = 0
max_wait_s = 60
tenant_share = 1.0
queued_share = 1.0
[tiers.free]
base_priority = 20
max_wait_s = 60
tenant_share = 0.5
queued_share = 1.0
"""


def test_ageing_serves_free_work_within_its_bound_under_premium_overload(
    deployment: Callable[[str], System],
) -> None:
    with running(deployment(AGEING_CONFIG)) as system:
        system.start_all(concurrency=2)
        premium, free = system.tenant("rich", "premium"), system.tenant("poor", "free")
        premium_ids: list[str] = []
        stop = threading.Event()

        def flood() -> None:  # premium work arrives faster than the pool serves it
            while not stop.is_set():
                premium_ids.append(submit(premium, "sleep", {"seconds": 0.2})["id"])
                time.sleep(0.05)

        flooder = threading.Thread(target=flood)
        flooder.start()
        try:
            wait_until(lambda: len(premium_ids) >= 10)
            free_job = submit(free, "sleep", {"seconds": 0.2})
            free_final = wait_terminal(free, free_job["id"])
            wait_until(lambda: len(premium_ids) >= 10 + 20 * 2)  # keep the backlog growing
        finally:
            stop.set()
            flooder.join()
        premium_final = [premium.get(f"/v1/jobs/{i}").json() for i in premium_ids]

    assert free_final["status"] == "succeeded"
    free_enqueued = ts(free_final["enqueued_at"])
    free_dispatched = ts(free_final["dispatched_at"])
    later = [j for j in premium_final if ts(j["enqueued_at"]) > free_enqueued + 20 * AGEING_RATE]
    assert later, "the premium flood did not outlast the free job's ageing"
    jumped = [j for j in later if j["dispatched_at"] and ts(j["dispatched_at"]) < free_dispatched]
    assert jumped == []
    # And the free job did wait behind the older premium backlog: ageing, not a free pass.
    earlier = [j for j in premium_final if ts(j["enqueued_at"]) < free_enqueued]
    assert any(j["dispatched_at"] and ts(j["dispatched_at"]) <= free_dispatched for j in earlier)


BOUND_CONFIG = """
[policy]
pool_concurrency = 1
mean_service_s = 10
[tiers.free]
base_priority = 20
max_wait_s = 30
tenant_share = 1.0
"""


def test_the_bound_refuses_with_capacity_and_is_never_exceeded(
    deployment: Callable[[str], System],
) -> None:
    # μ = 1 / 10 s; bound = floor(0.1 × 30) = 3 free jobs queued at most.
    with running(deployment(BOUND_CONFIG)) as system:
        system.start_all(concurrency=1)
        client = system.tenant("crowd", "free")
        statuses, depths = [], []
        for _ in range(8):
            response = client.post("/v1/jobs", json={"kind": "sleep", "payload": {"seconds": 5}})
            statuses.append(response.status_code)
            depths.append(client.get("/v1/queues").json()["tiers"][0]["queued"])
            if response.status_code == 429:
                refused = response
        assert 429 in statuses
        assert statuses.count(202) >= 3
        assert max(depths) <= 3
        body = refused.json()["error"]
        assert body["type"] == "capacity"
        assert int(refused.headers["retry-after"]) >= 1
        assert int(refused.headers["x-queue-position"]) >= 3
        assert refused.headers["x-tier"] == "free"
        assert body["retry_after_seconds"] >= 1


HAND_OVER_CONFIG = """
[policy]
mean_service_s = 0.5
"""


@contextlib.contextmanager
def stopped(process: Process) -> Iterator[None]:
    """``process`` (its whole group) stopped, as a stalled host would be, then continued."""
    os.killpg(process.popen.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(process.popen.pid, signal.SIGCONT)


@pytest.mark.parametrize(("broker", "pool"), [("redis", "threads"), ("rabbitmq", "threads"),
                                             ("redis", "prefork")], indirect=["broker"])
def test_a_freed_slot_takes_the_next_job_without_the_dispatcher(
    deployment: Callable[[str], System], pool: str,
) -> None:
    """A freed slot takes the next job itself, with no dispatcher round between two jobs:
    with the dispatcher stopped while work waits behind a running job, the worker drains it
    alone (threads: the message is handed to the worker's own consumer in-process; prefork:
    it goes to the worker's own queue, pushed by the index in the step that frees the slot
    on Redis)."""
    with running(deployment(HAND_OVER_CONFIG)) as system:
        system.start_api()
        dispatcher = system.start("dispatcher", "dispatcher")
        system.start("worker", "worker", "--concurrency", "1", "--celery-pool", pool)
        client = system.tenant("acme", "premium")
        system.wait_for_capacity(client, 1)
        first = submit(client, "sleep", {"seconds": 1})
        wait_status(client, first["id"], "running")

        with stopped(dispatcher):
            queued = [submit(client, "echo", {"n": n}) for n in range(2)]  # its quota
            ended = [wait_terminal(client, job["id"], timeout=30) for job in [first, *queued]]

    assert [(job["status"], job["attempt"]) for job in ended] == [("succeeded", 1)] * 3
    # One slot: each started once the one before it had ended, in the order submitted.
    spans = [(datetime.fromisoformat(job["started_at"]),
              datetime.fromisoformat(job["finished_at"])) for job in ended]
    assert all(start >= ended_at for (_, ended_at), (start, _) in itertools.pairwise(spans))


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_submit_to_an_idle_worker_starts_without_the_dispatcher(
    deployment: Callable[[str], System],
) -> None:
    """A free slot takes a submitted job at once: the submit's own last step leases it and
    pushes its message to its tier's queue (``offer``), where the broker is the index's
    Redis, so no dispatcher round sits between a submit and its start on an idle pool. The
    dispatcher, once it has built the index, is stopped throughout, and each job still runs,
    one after the other."""
    with running(deployment(HAND_OVER_CONFIG)) as system:
        system.start_api()
        dispatcher = system.start("dispatcher", "dispatcher")
        system.start("worker", "worker", "--concurrency", "1")
        client = system.tenant("acme", "premium")
        system.wait_for_capacity(client, 1)
        system.wait_for_rebuild(dispatcher)
        with stopped(dispatcher):
            ended = []
            for n in range(3):
                job = submit(client, "echo", {"n": n})
                ended.append(wait_terminal(client, job["id"], timeout=30))

    assert [(job["status"], job["attempt"]) for job in ended] == [("succeeded", 1)] * 3
