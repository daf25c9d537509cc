"""Real worker processes (``python -m workers.main``) for tests, and the dispatcher's part
done by hand: a job inserted, indexed, leased and published as a submit and a dispatch
would, so a test decides exactly which job reaches which worker."""

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

from jobs.core.domain import Job, NewJob, Tenant
from jobs.index.base import IndexedJob
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from workers.publisher import CeleryPublisher

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


def worker_env(pg_url: str, redis_url: str, key_prefix: str, **more: str) -> dict[str, str]:
    """This process's environment without its TIERQ_ settings, then the test's (handlers
    set up lazily unless ``more`` says: a test that needs no model loads none)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env.update(TIERQ_DATABASE_URL=pg_url, TIERQ_REDIS_URL=redis_url,
               TIERQ_KEY_PREFIX=key_prefix, TIERQ_WORKER_SETUP="lazy", PYTHONUNBUFFERED="1")
    env.update(more)
    return env


def runtime_of(env: dict[str, str]) -> Runtime:
    """The test's own Runtime on the workers' database and index, every tier's cap 10."""
    settings = load_settings(database_url=env["TIERQ_DATABASE_URL"],
                             redis_url=env["TIERQ_REDIS_URL"],
                             key_prefix=env["TIERQ_KEY_PREFIX"])
    runtime = Runtime.from_settings(settings)
    runtime.index.set_caps({name: 10 for name in settings.tiers})
    return runtime


@contextlib.contextmanager
def worker_starter(env: dict[str, str], logs: Path) -> Iterator[Callable[..., Worker]]:
    """``start(concurrency, pool="threads")`` starts a worker; each is stopped at the end
    (SIGTERM, then SIGKILL to its process group)."""
    started: list[Worker] = []

    def start(concurrency: int, pool: str = "threads") -> Worker:
        log = logs / f"worker-{len(started)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "workers.main", "--concurrency", str(concurrency),
                 "--celery-pool", pool],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        worker = Worker(popen=popen, log=log)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            if worker.popen.poll() is None:
                worker.popen.send_signal(signal.SIGTERM)
            try:
                worker.popen.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.popen.pid, signal.SIGKILL)
                worker.popen.wait(5)


def new_tenant(runtime: Runtime, tier: str = "standard") -> Tenant:
    with runtime.sessions.begin() as session:
        return tenants_sql.create_tenant(session, name="acme", tier=tier, api_key_hash="hash",
                                         now=time.time())


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
         payload: dict[str, Any] | None = None, timeout_s: float | None = None,
         max_attempts: int = 3) -> Job:
    """Insert, index, lease and publish one job, as a submit and a dispatch would."""
    now = time.time()
    new = NewJob(
        tenant_id=tenant.id, tier=tenant.tier, kind=kind, payload=payload or {},
        timeout_s=timeout_s, order_key=runtime.policy.order_key(tenant.tier, now),
        enqueued_at=now, max_attempts=max_attempts,
    )
    with runtime.sessions.begin() as session:
        job = jobs_sql.insert_job(session, new)
    indexed = IndexedJob(job_id=job.id, tenant=tenant.id, tier=job.tier, order_key=job.order_key)
    assert runtime.index.admit(indexed, bound=1000).accepted
    (lease,) = runtime.index.dispatch(1, now=now, lease_ttl_s=runtime.policy.lease_ttl_s)
    assert lease.job_id == job.id
    publisher.publish(job.id, job.attempt, job.tier)
    return job


def finished(runtime: Runtime, job_id: str) -> Job | None:
    """The job once it is terminal, else None (a ``wait_for`` predicate)."""
    job = load(runtime, job_id)
    return job if job.terminal else None
