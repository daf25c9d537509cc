"""A real Celery worker process (``python -m workers.main``) on PostgreSQL and Redis.

The test does the dispatcher's part by hand (admit, dispatch, CAS queued → dispatched) and
publishes through ``CeleryPublisher``; the worker runs the job and records the outcome in
SQL. The worker registers its slots while it lives and unregisters on SIGTERM. Celery's task
events, turned on and read the way Flower does, show how each task ended.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobs.core.domain import Job, NewJob, Tenant
from jobs.core.states import Status
from jobs.index.base import IndexedJob
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from tests.integration.worker_procs import load, wait_for, worker_env
from tests.services import RedisServer
from workers.app import base_app, make_celery
from workers.publisher import CeleryPublisher
from workers.registration import MIN_TTL_S, WorkerRegistration, registration_ttl_s
from workers.tasks import TASK_NAME, JobFailedError

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LEASE_TTL_S = 30.0


@dataclass
class Worker:
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM (warm shutdown), then SIGKILL to its process group after ``grace`` s."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)
            raise


@pytest.fixture
def env(pg_url: str, redis_server: RedisServer, key_prefix: str) -> dict[str, str]:
    return worker_env(pg_url, redis_server.url, key_prefix,
                      TIERQ_HANDLERS="tests.handlers_for_tests:HANDLERS")


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[[int], Worker]]:
    started: list[Worker] = []

    def start(concurrency: int) -> Worker:
        log = tmp_path / f"worker-{len(started)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "workers.main", "--concurrency", str(concurrency)],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(popen=popen, log=log)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.stop()




def submit(runtime: Runtime, tenant: Tenant, kind: str, payload: dict[str, Any]) -> Job:
    now = time.time()
    new = NewJob(
        tenant_id=tenant.id, tier=tenant.tier, kind=kind, payload=payload,
        order_key=runtime.policy.order_key(tenant.tier, now), enqueued_at=now,
    )
    with runtime.sessions.begin() as session:
        job = jobs_sql.insert_job(session, new)
    indexed = IndexedJob(job_id=job.id, tenant=tenant.id, tier=job.tier, order_key=job.order_key)
    assert runtime.index.admit(indexed, bound=1000).accepted
    return job


def dispatch(runtime: Runtime, job: Job) -> Job:
    now = time.time()
    leases = runtime.index.dispatch(1, now=now, lease_ttl_s=LEASE_TTL_S)
    assert [lease.job_id for lease in leases] == [job.id]
    current = load(runtime, job.id)
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(
            session, job.id, src=Status.QUEUED, attempt=current.attempt,
            dst=Status.DISPATCHED, now=now,
        )
    return load(runtime, job.id)


def run_to_end(
    runtime: Runtime, publisher: CeleryPublisher, worker: Worker, tenant: Tenant,
    kind: str, payload: dict[str, Any],
) -> Job:
    job = dispatch(runtime, submit(runtime, tenant, kind, payload))
    publisher.publish(job.id, job.attempt, job.tier)
    wait_for(lambda: load(runtime, job.id).terminal, worker)
    return load(runtime, job.id)


def test_the_celery_configuration() -> None:
    """Prefetch off, acked on receipt, no results, one queue per tier, prefixed broker keys;
    a failed job's task raises an expected error that nothing retries."""
    settings = load_settings(redis_url="redis://127.0.0.1:6379/0", key_prefix="{acme}:")
    conf = make_celery(settings).conf
    assert conf.worker_prefetch_multiplier == 1
    assert conf.worker_disable_prefetch is True
    assert conf.task_acks_late is False
    assert conf.task_ignore_result is True
    assert not conf.result_backend
    assert not conf.worker_send_task_events and not conf.task_send_sent_event  # until asked
    assert [q.name for q in conf.task_queues] == [f"tier.{name}" for name in settings.tiers]
    assert conf.task_default_queue == f"tier.{next(iter(settings.tiers))}"
    assert conf.broker_transport_options == {"global_keyprefix": "{acme}:",
                                             "ack_emulation": False}
    assert conf.task_acks_on_failure_or_timeout and not conf.task_reject_on_worker_lost
    task = make_celery(settings).tasks[TASK_NAME]
    assert task.throws == (JobFailedError,) and not task.acks_late and task.max_retries == 0
    # The prefork pool pickles a task's exception to its parent.
    error = pickle.loads(pickle.dumps(JobFailedError("j1", "RuntimeError: boom")))
    assert (error.job_id, error.error) == ("j1", "RuntimeError: boom")
    assert str(error) == "job j1 failed: RuntimeError: boom"

    amqp = load_settings(broker_url="amqp://guest@127.0.0.1:5672//")
    amqp_conf = make_celery(amqp).conf
    assert amqp_conf.broker_transport_options == {"confirm_publish": True}
    assert not amqp_conf.worker_disable_prefetch


def test_a_registration_expires_unless_renewed_and_stop_unregisters(runtime: Runtime) -> None:
    now, rings = 1_800_000_000.0, []
    registration = WorkerRegistration(
        runtime.index, worker_id="w1", slots=3, ttl_s=10.0, on_register=lambda: rings.append(1),
        clock=lambda: now,
    )
    registration.start()
    try:
        assert rings == [1]
        assert runtime.index.pool_capacity(now=now + 9.9) == 3
        assert runtime.index.pool_capacity(now=now + 10.1) == 0  # a dead worker's slots lapse
        now += 5
        registration.register_once()
        assert runtime.index.pool_capacity(now=now + 9.9) == 3
    finally:
        registration.stop()
    assert runtime.index.pool_capacity(now=now) == 0
    registration.stop()  # idempotent
    assert registration_ttl_s(runtime.policy) == max(MIN_TTL_S, runtime.policy.lease_ttl_s)


def test_a_worker_runs_jobs_and_holds_its_slots_while_it_lives(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[[int], Worker],
    tenant: Tenant,
) -> None:
    worker = start_worker(2)
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 2, worker)
    (registered,) = runtime.index.live_workers()
    assert (registered.device, registered.slots) == ("cpu", 2)  # no GPU on this host

    done = run_to_end(runtime, publisher, worker, tenant, "echo", {"hello": "world"})
    failed = run_to_end(runtime, publisher, worker, tenant, "sleep", {"seconds": 0, "fail": True})
    recorded = run_to_end(runtime, publisher, worker, tenant, "record", {})  # from TIERQ_HANDLERS

    assert (done.status, done.result) == (Status.SUCCEEDED, {"hello": "world"})
    assert failed.status is Status.FAILED
    assert failed.error is not None and failed.error.startswith("RuntimeError: ")
    assert (recorded.status, recorded.result) == (Status.SUCCEEDED, {"attempt": 1})
    assert runtime.index.inflight() == 0
    assert runtime.index.pool_capacity(now=time.time()) == 2

    assert worker.stop() == 0
    assert runtime.index.pool_capacity(now=time.time()) == 0


def test_stale_and_duplicate_messages_leave_jobs_untouched(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[[int], Worker],
    tenant: Tenant,
) -> None:
    worker = start_worker(1)
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
    finished = run_to_end(runtime, publisher, worker, tenant, "record", {})
    # A job whose attempt 1 was given up on by the reaper; attempt 2 is dispatched (leased).
    job = dispatch(runtime, submit(runtime, tenant, "record", {}))
    runtime.index.reap(now=time.time() + 3600)
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(
            session, job.id, src=Status.DISPATCHED, attempt=1, dst=Status.QUEUED, now=time.time()
        )
    runtime.index.requeue(
        IndexedJob(job_id=job.id, tenant=tenant.id, tier=job.tier, order_key=job.order_key)
    )
    second = dispatch(runtime, job)

    publisher.publish(finished.id, 1, finished.tier)  # a duplicate of a finished job
    publisher.publish(job.id, 1, job.tier)  # attempt 1 of a job now at attempt 2
    # One slot, one queue: once a later job has run, the two messages before it have too.
    sentinel = run_to_end(runtime, publisher, worker, tenant, "echo", {})

    assert sentinel.status is Status.SUCCEEDED
    assert load(runtime, finished.id) == finished
    assert load(runtime, job.id) == second
    assert runtime.index.tenant_inflight(tenant.id) == 1  # attempt 2's lease is untouched


class TaskEvents:
    """Celery's task events as Flower sees them: a receiver on the broker feeding a State."""

    def __init__(self, settings: Any) -> None:
        self.app = base_app(settings, name="tierq-events")
        self.state = self.app.events.State()
        self.kinds: list[tuple[str, str]] = []  # (event type, task uuid)
        self.heard = threading.Event()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on_event})
            self._receiver.capture(limit=None, timeout=None, wakeup=True)

    def _on_event(self, event: dict[str, Any]) -> None:
        self.state.event(event)
        if event["type"].startswith("task-"):
            self.kinds.append((event["type"], event["uuid"]))
        self.heard.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(10)
        self.app.close()

    def task_of(self, job_id: str) -> Any:
        tasks = [task for _, task in self.state.tasks_by_time() if job_id in (task.args or "")]
        assert len(tasks) == 1, tasks
        return tasks[0]

    def count(self, kind: str, uuid: str) -> int:
        return self.kinds.count((kind, uuid))


@pytest.fixture
def task_events(runtime: Runtime) -> Iterator[TaskEvents]:
    events = TaskEvents(runtime.settings)
    events.start()
    yield events
    events.stop()


def test_a_failed_job_ends_its_celery_task_in_failure_and_runs_once(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[[int], Worker],
    tenant: Tenant, task_events: TaskEvents,
) -> None:
    """What Flower shows: FAILURE for a job that failed, SUCCESS with the outcome otherwise;
    the failed task is neither retried nor redelivered, and the worker logs it in one line."""
    worker = start_worker(1)
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
    wait_for(task_events.heard.is_set, worker)  # the receiver is listening (worker heartbeat)
    # Task events are off until a monitor asks, as Flower does while it runs.
    replies = task_events.app.control.broadcast("enable_events", reply=True, timeout=5)
    assert replies, "the worker did not answer enable_events"

    failed = run_to_end(runtime, publisher, worker, tenant, "sleep", {"seconds": 0, "fail": True})
    # One slot, one queue: a later job's end means any redelivery of the first would have run.
    done = run_to_end(runtime, publisher, worker, tenant, "echo", {"n": 1})
    wait_for(lambda: task_events.task_of(done.id).state == "SUCCESS", worker, timeout=20)

    assert failed.status is Status.FAILED and failed.attempt == 1
    assert failed.error is not None and failed.error.startswith("RuntimeError: ")
    task = task_events.task_of(failed.id)
    assert task.state == "FAILURE"
    assert "JobFailedError" in task.exception and failed.id in task.exception
    assert failed.error in task.exception
    assert task_events.count("task-received", task.uuid) == 1
    assert task_events.count("task-started", task.uuid) == 1
    assert task_events.count("task-retried", task.uuid) == 0
    assert task_events.task_of(done.id).result == repr("succeeded")
    log = worker.output()
    assert "raised unexpected" not in log
    assert "raised expected: JobFailedError" in log


def test_a_full_worker_takes_its_next_message_as_a_slot_frees(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[[int], Worker],
    tenant: Tenant,
) -> None:
    """One slot, eight messages waiting, task events off: each next job starts as the last
    one ends, not at the event loop's one-second timeout (``workers.pool``)."""
    worker = start_worker(1)
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
    jobs = [dispatch(runtime, submit(runtime, tenant, "echo", {"n": n})) for n in range(8)]
    for job in jobs:
        publisher.publish(job.id, job.attempt, job.tier)
    wait_for(lambda: all(load(runtime, job.id).terminal for job in jobs), worker, timeout=60)

    done = sorted((load(runtime, job.id) for job in jobs), key=lambda job: job.started_at or 0)
    assert all(job.status is Status.SUCCEEDED for job in done)
    gaps = [
        (after.started_at or 0) - (before.finished_at or 0)
        for before, after in itertools.pairwise(done)
    ]
    # Waiting for the loop's timeout made every gap about a second.
    assert statistics.median(gaps) < 0.5, gaps
