"""Run-time limits on real worker processes (``python -m workers.main``), both pools.

A handler that stops when asked ends at its limit, ``timed_out``, in the worker that keeps
running; one that ignores every stop is ended with the process running it at its limit
plus ``policy.timeout_grace_s``: a prefork child is replaced and the next job runs in the
same worker; a worker on the thread pool hands back its other job, uncharged, and exits
for its supervisor to start it again. Either way, and when a worker's stop grace runs out
on a handler that will not stop, every process the handler started ends with it. The
dispatcher's part is done by hand (``tests.integration.worker_procs``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from jobs.core.domain import Tenant
from jobs.core.states import Status
from jobs.execution.limits import EXIT_OVERRUN
from jobs.process.runtime import Runtime
from tests.integration.worker_procs import (
    Worker,
    finished,
    load,
    send,
    wait_for,
    worker_env,
    worker_starter,
)
from tests.services import RedisServer
from workers.publisher import CeleryPublisher

pytestmark = pytest.mark.integration

GRACE_S = 1.0  # policy.timeout_grace_s of these workers
STOP_GRACE_S = 2.0  # policy.stop_grace_s: hand-back after max(1, -1) = 1 s


@pytest.fixture
def env(pg_url: str, redis_server: RedisServer, key_prefix: str) -> dict[str, str]:
    return worker_env(pg_url, redis_server.url, key_prefix,
                      TIERQ_HANDLERS="tests.handlers_for_tests:LIMIT_HANDLERS",
                      TIERQ_POLICY__TIMEOUT_GRACE_S=str(GRACE_S),
                      TIERQ_POLICY__STOP_GRACE_S=str(STOP_GRACE_S))


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with worker_starter(env, tmp_path) as start:
        yield start


def running(runtime: Runtime, job_id: str) -> bool:
    return load(runtime, job_id).status is Status.RUNNING


@pytest.fixture
def child_pid_file(tmp_path: Path) -> Iterator[Path]:
    """Where a ``hang`` handler writes the pid of the child it starts; a child left running
    by a failing test is killed afterwards."""
    path = tmp_path / "child.pid"
    yield path
    if path.exists():
        try:
            child = psutil.Process(int(path.read_text()))
            if child.name() == "sleep":
                child.kill()
        except psutil.Error:
            pass


def child_of(pid_file: Path, worker: Worker) -> psutil.Process:
    """The process the handler started, once it has."""
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), worker)
    return psutil.Process(int(pid_file.read_text()))


def ended(process: psutil.Process) -> bool:
    """Gone, or dead and not yet reaped by whoever inherited it."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_handler_that_stops_when_asked_ends_timed_out_at_its_limit(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[..., Worker],
    tenant: Tenant,
) -> None:
    worker = start_worker(1, "threads")
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
    job = send(runtime, publisher, tenant, "block", timeout_s=1.0)
    ended = wait_for(lambda: finished(runtime, job.id), worker)
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
    ended = wait_for(lambda: finished(runtime, job.id), worker)
    assert (ended.status, ended.error_type, ended.starts) == (Status.FAILED, "timed_out", 2)
    assert ended.error is not None and "start 2 of 2" in ended.error


def test_a_hung_handler_in_a_prefork_child_ends_with_the_child_and_the_slot_runs_on(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[..., Worker],
    tenant: Tenant, child_pid_file: Path,
) -> None:
    worker = start_worker(1, "prefork")
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
    job = send(runtime, publisher, tenant, "hang", timeout_s=1.0,
               payload={"child_pid_file": str(child_pid_file)})
    started = child_of(child_pid_file, worker)
    done = wait_for(lambda: finished(runtime, job.id), worker)
    assert (done.status, done.error_type) == (Status.FAILED, "timed_out")
    assert done.started_at is not None and done.finished_at is not None
    assert 1.0 + GRACE_S <= done.finished_at - done.started_at < 1.0 + GRACE_S + 2.0
    # What the handler started (a binary holding the GPU) ends with the process running it.
    assert wait_for(lambda: ended(started), worker, timeout=10.0)
    # Its lease is released right after the record commits (docs/states.md: the ending).
    assert wait_for(lambda: runtime.index.inflight() == 0, worker)

    after = send(runtime, publisher, tenant, "echo")  # a new child takes the next job
    assert wait_for(lambda: load(runtime, after.id).status is Status.SUCCEEDED, worker)
    assert worker.popen.poll() is None
    assert "exited with 'exitcode 70'" in worker.output()


def test_a_hung_handler_on_the_thread_pool_ends_its_worker_and_the_other_job_goes_back(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[..., Worker],
    tenant: Tenant, child_pid_file: Path,
) -> None:
    worker = start_worker(2, "threads")
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 2, worker)
    # Sleeps through ctx.sleep, so the stop's hand-back ends it (WorkerStopping).
    other = send(runtime, publisher, tenant, "sleep", payload={"seconds": 600})
    wait_for(lambda: running(runtime, other.id), worker)
    hung = send(runtime, publisher, tenant, "hang", timeout_s=1.0,
                payload={"child_pid_file": str(child_pid_file)})
    started = child_of(child_pid_file, worker)
    assert worker.popen.wait(1.0 + GRACE_S + STOP_GRACE_S + 20) == EXIT_OVERRUN, worker.output()
    assert wait_for(lambda: ended(started), worker, timeout=10.0, may_exit=True)

    done = load(runtime, hung.id)
    assert (done.status, done.error_type) == (Status.FAILED, "timed_out")
    back = load(runtime, other.id)  # handed back within the stop grace: a new attempt, uncharged
    assert (back.status, back.attempt, back.starts) == (Status.QUEUED, 2, 0)
    assert runtime.index.inflight() == 0


def test_a_stop_whose_grace_runs_out_ends_what_a_hung_handler_started(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[..., Worker],
    tenant: Tenant, child_pid_file: Path,
) -> None:
    """A worker told to stop asks its handlers to stop; one that will not is killed with its
    worker at the end of the grace, and what it started must not outlive it: the worker ends
    those processes itself before the grace runs out."""
    worker = start_worker(1, "threads")
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
    send(runtime, publisher, tenant, "hang", timeout_s=600.0,
         payload={"child_pid_file": str(child_pid_file)})
    started = child_of(child_pid_file, worker)
    worker.popen.send_signal(signal.SIGTERM)
    try:
        assert wait_for(lambda: ended(started), worker, timeout=STOP_GRACE_S + 10.0,
                        may_exit=True)
    finally:
        worker.popen.kill()  # the hung handler keeps it alive: the orchestrator's kill
