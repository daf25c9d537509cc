"""Graceful shutdown of a real worker process (SIGTERM, as a deploy or ``docker stop`` sends).

The worker leaves the pool at once (its slots stop counting, so nothing more is dispatched to
it), takes no new message, finishes the job in hand and exits 0. Work it did not take stays
where it was (queued in the index, or its message in the broker) and runs on the next
worker. The test does the dispatcher's part with ``Dispatcher.run_once``; a submit to a free
slot dispatches its job itself (``offer``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs.admission.submit import Submission, submit
from jobs.core.domain import Job, Tenant
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from tests.services import RedisServer
from workers.handlers import default_registry
from workers.publisher import CeleryPublisher

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT_S = 30.0


@pytest.fixture
def env(pg_url: str, redis_server: RedisServer, key_prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env.update(
        TIERQ_DATABASE_URL=pg_url,
        TIERQ_REDIS_URL=redis_server.url,
        TIERQ_KEY_PREFIX=key_prefix,
        TIERQ_WORKER_SETUP="lazy",  # no model loaded for jobs that need none
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def runtime(env: dict[str, str], redis_client: redis.Redis) -> Iterator[Runtime]:
    rt = Runtime.from_settings(
        load_settings(
            database_url=env["TIERQ_DATABASE_URL"],
            redis_url=env["TIERQ_REDIS_URL"],
            key_prefix=env["TIERQ_KEY_PREFIX"],
        )
    )
    yield rt
    rt.close()


@pytest.fixture
def dispatcher(runtime: Runtime) -> Iterator[Dispatcher]:
    publisher = CeleryPublisher(runtime.settings)
    dispatcher = Dispatcher(runtime, publisher)
    dispatcher.rebuild(time.time())  # as at leadership: the index is whole, offers lease
    yield dispatcher
    publisher.close()


@pytest.fixture
def start_worker(
    env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(pool: str = "threads", grace_s: float | None = None) -> subprocess.Popen[bytes]:
        log = tmp_path / f"worker-{len(started)}.log"
        extra = {} if grace_s is None else {"TIERQ_POLICY__STOP_GRACE_S": str(grace_s)}
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "workers.main", "--concurrency", "1", "--celery-pool", pool],
                cwd=ROOT, env={**env, **extra}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append((popen, log))
        return popen

    yield start
    for popen, log in started:
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(5)
        sys.stderr.write(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}\n")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.05)


def tenant(runtime: Runtime, name: str) -> Tenant:
    """A standard tenant that may queue more than a one-slot pool's quota."""
    with runtime.sessions.begin() as session:
        created = tenants_sql.create_tenant(
            session, name=name, tier="standard", api_key_hash=name, now=time.time()
        )
        updated = tenants_sql.update_tenant(session, created.id, max_queued=10)
    assert updated is not None
    return updated


def load(runtime: Runtime, job_id: str) -> Job:
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None
    return job


def capacity(runtime: Runtime) -> int:
    return runtime.index.pool_capacity(now=time.time())


def test_sigterm_finishes_the_job_in_hand_takes_nothing_new_and_loses_nothing(
    runtime: Runtime, dispatcher: Dispatcher, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    registry = default_registry("")
    first = start_worker()
    wait_for(lambda: capacity(runtime) == 1)
    alice, bob = tenant(runtime, "alice"), tenant(runtime, "bob")
    in_hand, sent, queued = (
        submit(runtime, registry, owner, Submission(kind=kind, payload=payload)).progress.job
        for owner, kind, payload in (
            (alice, "sleep", {"seconds": 2}), (bob, "echo", {"n": 1}), (bob, "echo", {"n": 2}),
        )
    )
    # One slot: the first submit offered it the oldest job (``offer``); nothing is left to
    # dispatch while it runs.
    wait_for(lambda: load(runtime, in_hand.id).status is Status.RUNNING)
    assert dispatcher.run_once(time.time()).dispatched == 0

    first.send_signal(signal.SIGTERM)
    wait_for(lambda: capacity(runtime) == 0)  # it left the pool before its job finished
    assert load(runtime, in_hand.id).status is Status.RUNNING
    assert dispatcher.run_once(time.time()).dispatched == 0
    # A message already on its way (sent just before the pool shrank) is not taken either.
    [lease] = runtime.index.dispatch(1, now=time.time(), lease_ttl_s=300)
    assert lease.job_id == sent.id
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(
            session, sent.id, src=Status.QUEUED, attempt=1, dst=Status.DISPATCHED, now=time.time()
        )
    dispatcher.publisher.publish(sent.id, 1, sent.tier)

    assert first.wait(EXIT_TIMEOUT_S) == 0
    done = load(runtime, in_hand.id)
    assert (done.status, done.attempt, done.result) == (Status.SUCCEEDED, 1, {"slept": 2.0})
    assert load(runtime, sent.id).status is Status.DISPATCHED
    assert load(runtime, queued.id).status is Status.QUEUED
    assert runtime.index.tenant_inflight(alice.id) == 0

    start_worker()  # the next worker runs what the first one left
    wait_for(lambda: capacity(runtime) == 1)

    def all_done() -> bool:
        dispatcher.run_once(time.time())
        return all(load(runtime, job.id).terminal for job in (sent, queued))

    wait_for(all_done)
    for job in (sent, queued):
        final = load(runtime, job.id)
        assert (final.status, final.attempt) == (Status.SUCCEEDED, 1)
    assert runtime.index.inflight() == 0


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_job_that_cannot_finish_within_the_stop_grace_goes_back_uncharged(
    runtime: Runtime, dispatcher: Dispatcher, start_worker: Callable[..., subprocess.Popen[bytes]],
    pool: str,
) -> None:
    """SIGTERM to the worker process alone, as ``docker stop`` sends it: a prefork worker
    passes it on to the child running the job."""
    registry = default_registry("")
    worker = start_worker(pool=pool, grace_s=2)  # hands back 1 s after the signal
    wait_for(lambda: capacity(runtime) == 1)
    alice = tenant(runtime, "alice")
    job = submit(runtime, registry, alice,
                 Submission(kind="sleep", payload={"seconds": 120})).progress.job
    wait_for(lambda: load(runtime, job.id).status is Status.RUNNING)  # offered to the slot

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(EXIT_TIMEOUT_S) == 0  # not the job's 120 s, and no kill needed
    back = load(runtime, job.id)
    assert (back.status, back.attempt, back.starts, back.started_at) == (
        Status.QUEUED, 2, 0, None)  # the interrupted start is not charged
    assert runtime.index.tenant_inflight(alice.id) == 0
    # In the index again, as its next attempt, first in line.
    [lease] = runtime.index.dispatch(1, now=time.time(), lease_ttl_s=30)
    assert (lease.job_id, lease.attempt) == (job.id, 2)
