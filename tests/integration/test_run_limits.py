"""Run-time limits on real worker processes (``python -m workers.main``), both pools.

A handler that stops when asked ends at its limit, ``timed_out``, in the worker that keeps
running; one that ignores every stop is ended with the process running it at its limit
plus ``policy.timeout_grace_s``: a prefork child is replaced and the next job runs in the
same worker; a worker on the thread pool hands back its other job, uncharged, and exits
for its supervisor to start it again. The dispatcher's part is done by hand, as in
``test_worker_process``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs.core.domain import Job, NewJob, Tenant
from jobs.core.states import Status
from jobs.execution.limits import EXIT_OVERRUN
from jobs.index.base import IndexedJob
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from tests.services import RedisServer
from workers.publisher import CeleryPublisher

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 1.0  # policy.timeout_grace_s of these workers
STOP_GRACE_S = 2.0  # policy.stop_grace_s: hand-back after max(1, -1) = 1 s


@dataclass
class Worker:
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@pytest.fixture
def settings_env(pg_url: str, redis_server: RedisServer, key_prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env.update(
        TIERQ_DATABASE_URL=pg_url,
        TIERQ_REDIS_URL=redis_server.url,
        TIERQ_KEY_PREFIX=key_prefix,
        TIERQ_HANDLERS="tests.handlers_for_tests:LIMIT_HANDLERS",
        TIERQ_POLICY__TIMEOUT_GRACE_S=str(GRACE_S),
        TIERQ_POLICY__STOP_GRACE_S=str(STOP_GRACE_S),
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def runtime(settings_env: dict[str, str], redis_client: redis.Redis) -> Iterator[Runtime]:
    settings = load_settings(
        database_url=settings_env["TIERQ_DATABASE_URL"],
        redis_url=settings_env["TIERQ_REDIS_URL"],
        key_prefix=settings_env["TIERQ_KEY_PREFIX"],
    )
    rt = Runtime.from_settings(settings)
    rt.index.set_caps({name: 10 for name in settings.tiers})
    yield rt
    rt.close()


@pytest.fixture
def publisher(runtime: Runtime) -> Iterator[CeleryPublisher]:
    publisher = CeleryPublisher(runtime.settings)
    yield publisher
    publisher.close()


@pytest.fixture
def start_worker(settings_env: dict[str, str], tmp_path: Path
                 ) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(concurrency: int, pool: str) -> Worker:
        log = tmp_path / f"worker-{len(started)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "workers.main", "--concurrency", str(concurrency),
                 "--pool", pool],
                cwd=ROOT, env=settings_env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(popen=popen, log=log)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.popen.poll() is None:
            worker.popen.send_signal(signal.SIGTERM)
        try:
            worker.popen.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.popen.pid, signal.SIGKILL)
            worker.popen.wait(5)


@pytest.fixture
def tenant(runtime: Runtime) -> Tenant:
    with runtime.sessions.begin() as session:
        return tenants_sql.create_tenant(
            session, name="acme", tier="standard", api_key_hash="hash", now=time.time()
        )


def wait_for(predicate: Callable[[], Any], worker: Worker, timeout: float = 60.0,
             *, may_exit: bool = False) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if not may_exit and worker.popen.poll() is not None:
            pytest.fail(f"the worker exited ({worker.popen.returncode}):\n{worker.output()}")
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s; worker log:\n{worker.output()}")
        time.sleep(0.05)


def load(runtime: Runtime, job_id: str) -> Job:
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None
    return job


def send(runtime: Runtime, publisher: CeleryPublisher, tenant: Tenant, kind: str, *,
         timeout_s: float | None = None, max_attempts: int = 3,
         payload: dict[str, Any] | None = None) -> Job:
    """Insert, index, lease and publish one job, as a submit and a dispatch would."""
    now = time.time()
    new = NewJob(
        tenant_id=tenant.id, tier=tenant.tier, kind=kind, payload=payload or {},
        timeout_s=timeout_s,
        order_key=runtime.policy.order_key(tenant.tier, now), enqueued_at=now,
        max_attempts=max_attempts,
    )
    with runtime.sessions.begin() as session:
        job = jobs_sql.insert_job(session, new)
    indexed = IndexedJob(job_id=job.id, tenant=tenant.id, tier=job.tier, order_key=job.order_key)
    assert runtime.index.admit(indexed, bound=1000).accepted
    (lease,) = runtime.index.dispatch(1, now=now, lease_ttl_s=runtime.policy.lease_ttl_s)
    assert lease.job_id == job.id
    publisher.publish(job.id, job.attempt, job.tier)
    return job


def running(runtime: Runtime, job_id: str) -> bool:
    return load(runtime, job_id).status is Status.RUNNING


def test_a_handler_that_stops_when_asked_ends_timed_out_at_its_limit(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[..., Worker],
    tenant: Tenant,
) -> None:
    worker = start_worker(1, "threads")
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
    job = send(runtime, publisher, tenant, "block", timeout_s=1.0)
    ended = wait_for(lambda: load(runtime, job.id).terminal and load(runtime, job.id), worker)
    assert ended.status is Status.FAILED
    assert ended.error_type == "timed_out"
    assert ended.error is not None and "run-time limit of 1 s" in ended.error
    assert ended.started_at is not None and ended.finished_at is not None
    ran = ended.finished_at - ended.started_at
    assert 1.0 <= ran < 1.0 + GRACE_S  # asked at its limit, it stopped before the grace ran out

    after = send(runtime, publisher, tenant, "echo")  # the worker lives on, its slot free
    assert wait_for(lambda: load(runtime, after.id).status is Status.SUCCEEDED, worker)
    assert worker.popen.poll() is None


def test_a_kind_s_own_limit_applies_and_its_timeouts_are_retried_while_starts_remain(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[..., Worker],
    tenant: Tenant,
) -> None:
    worker = start_worker(1, "threads")
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
    job = send(runtime, publisher, tenant, "limited", max_attempts=2)  # its kind says 0.5 s
    first = wait_for(lambda: (j := load(runtime, job.id)).attempt == 2 and j, worker)
    assert first.starts == 1 and first.status in (Status.QUEUED, Status.RUNNING)
    # The retry waits out its backoff; nobody dispatches it here, so do it by hand.
    wait_for(lambda: runtime.index.dispatch(1, now=time.time(), lease_ttl_s=30.0), worker)
    publisher.publish(job.id, 2, job.tier)
    ended = wait_for(lambda: load(runtime, job.id).terminal and load(runtime, job.id), worker)
    assert (ended.status, ended.error_type, ended.starts) == (Status.FAILED, "timed_out", 2)
    assert ended.error is not None and "start 2 of 2" in ended.error


def test_a_hung_handler_in_a_prefork_child_ends_with_the_child_and_the_slot_runs_on(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[..., Worker],
    tenant: Tenant,
) -> None:
    worker = start_worker(1, "prefork")
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
    job = send(runtime, publisher, tenant, "hang", timeout_s=1.0)
    ended = wait_for(lambda: load(runtime, job.id).terminal and load(runtime, job.id), worker)
    assert (ended.status, ended.error_type) == (Status.FAILED, "timed_out")
    assert ended.started_at is not None and ended.finished_at is not None
    assert 1.0 + GRACE_S <= ended.finished_at - ended.started_at < 1.0 + GRACE_S + 2.0
    assert runtime.index.inflight() == 0  # its lease released with the record

    after = send(runtime, publisher, tenant, "echo")  # a new child takes the next job
    assert wait_for(lambda: load(runtime, after.id).status is Status.SUCCEEDED, worker)
    assert worker.popen.poll() is None
    assert "exited with 'exitcode 70'" in worker.output()


def test_a_hung_handler_on_the_thread_pool_ends_its_worker_and_the_other_job_goes_back(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[..., Worker],
    tenant: Tenant,
) -> None:
    worker = start_worker(2, "threads")
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 2, worker)
    # Sleeps through ctx.sleep, so the stop's hand-back ends it (WorkerStopping).
    other = send(runtime, publisher, tenant, "sleep", payload={"seconds": 600})
    wait_for(lambda: running(runtime, other.id), worker)
    hung = send(runtime, publisher, tenant, "hang", timeout_s=1.0)
    assert worker.popen.wait(1.0 + GRACE_S + STOP_GRACE_S + 20) == EXIT_OVERRUN, worker.output()

    ended = load(runtime, hung.id)
    assert (ended.status, ended.error_type) == (Status.FAILED, "timed_out")
    back = load(runtime, other.id)  # handed back within the stop grace: a new attempt, uncharged
    assert (back.status, back.attempt, back.starts) == (Status.QUEUED, 2, 0)
    assert runtime.index.inflight() == 0
