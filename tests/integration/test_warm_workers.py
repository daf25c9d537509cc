"""Warm workers on real processes: each handler's ``setup()`` runs once per process before
the worker takes a job (before it registers its slots, on the thread pool; as each child
starts, on prefork), so no job pays for loading a model; a setup that fails stops the
worker at start, naming the kind."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.core.domain import Tenant
from jobs.core.states import Status
from jobs.process.runtime import Runtime
from tests.integration.worker_procs import (
    Worker,
    finished,
    send,
    wait_for,
    worker_env,
    worker_starter,
)
from tests.services import RedisServer
from workers.publisher import CeleryPublisher

pytestmark = pytest.mark.integration


@pytest.fixture
def env(pg_url: str, redis_server: RedisServer, key_prefix: str) -> dict[str, str]:
    return worker_env(pg_url, redis_server.url, key_prefix, TIERQ_WORKER_SETUP="eager",
                      TIERQ_HANDLERS="tests.handlers_for_tests:WARM_HANDLERS")




def events(worker: Worker) -> list[dict[str, Any]]:
    """The worker's JSON log lines (Celery's own text lines skipped)."""
    found = []
    for line in worker.lines():
        if line.startswith("{"):
            record = json.loads(line)
            if "event" in record:
                found.append(record)
    return found


def logged(worker: Worker, event: str) -> list[str] | None:
    """The events the worker logged, once ``event`` is among them (a registration is logged
    just after it lands in Redis, where the test saw it first)."""
    names = [e["event"] for e in events(worker)]
    return names if event in names else None


@pytest.mark.parametrize(("pool", "setup"),
                         [("threads", "eager"), ("prefork", "eager"), ("threads", "lazy")])
def test_a_handler_is_set_up_once_per_process_before_its_first_job(
    env: dict[str, str], runtime: Runtime, publisher: CeleryPublisher, tenant: Tenant,
    tmp_path: Path, pool: str, setup: str,
) -> None:
    with worker_starter({**env, "TIERQ_WORKER_SETUP": setup}, tmp_path) as start:
        worker = start(1, pool)
        wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)
        names = wait_for(lambda: logged(worker, "worker.registered"), worker, 30)
        if (pool, setup) == ("threads", "eager"):  # set up before the slots were registered
            assert names.index("worker.handler_ready") < names.index("worker.registered")
        if setup == "lazy":  # registered at once; set up by the first job of its kind
            assert "worker.handler_ready" not in names
        results = []
        for _ in range(2):
            job = send(runtime, publisher, tenant, "warm")
            ended = wait_for(lambda job_id=job.id: finished(runtime, job_id), worker)
            assert ended.status is Status.SUCCEEDED, ended.error
            results.append(ended.result)
        assert results == [{"set_up_here": True, "setups": 1}] * 2
        ready = [e for e in events(worker)
                 if e["event"] == "worker.handler_ready" and e["kind"] == "warm"]
        assert len(ready) == 1 and ready[0]["duration_s"] >= 1.0  # once, in its process


def test_a_worker_whose_handler_cannot_set_up_does_not_start(
    env: dict[str, str], runtime: Runtime, tmp_path: Path,
) -> None:
    env = {**env, "TIERQ_HANDLERS": "tests.handlers_for_tests:BrokenSetupHandler"}
    with worker_starter(env, tmp_path) as start:
        worker = start(1)
        assert worker.popen.wait(60) == 2
    assert "'broken.setup' failed its setup: RuntimeError: no device here" in worker.output()
    assert runtime.index.pool_capacity(now=time.time()) == 0


def test_a_worker_with_the_models_extra_loads_its_model_before_it_takes_a_job(
    env: dict[str, str], runtime: Runtime, publisher: CeleryPublisher, tenant: Tenant,
    tmp_path: Path,
) -> None:
    env = {**env, "TIERQ_HANDLERS": ""}  # the extra's kinds come from its entry point
    with worker_starter(env, tmp_path) as start:
        worker = start(1)
        wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker, 180)
        before = wait_for(lambda: logged(worker, "worker.registered"), worker, 30)
        assert before.index("model.loaded") < before.index("worker.registered")
        job = send(runtime, publisher, tenant, "eval.similarity", payload={
            "pairs": [["a cat sits", "a cat is sitting"], ["a cat sits", "stock prices"]],
            "labels": [1.0, 0.0]})
        done = wait_for(lambda: finished(runtime, job.id), worker, 120)
        assert done.status is Status.SUCCEEDED, done.error
        assert [e["event"] for e in events(worker)].count("model.loaded") == 1  # not again
