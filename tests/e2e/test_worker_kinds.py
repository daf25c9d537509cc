"""Workers of one pool that run different kinds, on real processes over HTTP: an API and a
dispatcher that know ``text.upper`` (a deployment's own handler, ``TIERQ_HANDLERS``), a plain
worker without it (a second host without the module, a rolling deploy), then one with it.

A job of the kind never fails for landing on the plain worker: while no live worker runs the
kind its jobs wait in their places, uncharged, and ``GET /v1/queues`` names the kind and how
many wait; once a worker that runs it registers they start, there, and so do the kind's later
jobs, every one on that worker, while the plain worker keeps running the kinds it has."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.e2e.harness import System, running, system_env, wait_terminal, wait_until
from tests.e2e.test_system import submit
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[policy]
mean_service_s = 0.1
pool_concurrency = 4
[tiers.standard]
base_priority = 10
max_wait_s = 60
tenant_share = 1.0
queued_share = 1.0
"""


@pytest.fixture
def system(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
) -> Iterator[System]:
    path = tmp_path / "tierq.toml"
    path.write_text(CONFIG)
    env = system_env(database_url=pg_url, redis_url=redis_server.url, key_prefix=key_prefix,
                     extra={"TIERQ_CONFIG": str(path), "PYTHONPATH": str(ROOT),
                            "TIERQ_HANDLERS": "tests.handlers_for_tests:UpperHandler"})
    with running(System(env=env, workdir=tmp_path)) as started:
        yield started


def default_pool(admin: httpx.Client) -> dict[str, Any]:
    pool: dict[str, Any] = admin.get("/v1/queues").json()["pools"][0]["pool"]
    return pool


def test_a_kind_reaches_only_workers_that_run_it_and_waits_while_none_does(
    system: System,
) -> None:
    system.start_api()
    dispatcher = system.start("dispatcher", "dispatcher")
    system.start("plain", "worker", "--concurrency", "2", env={"TIERQ_HANDLERS": ""})
    client = system.tenant("acme", "standard")
    admin = system.admin()
    system.clients.append(admin)
    system.wait_for_rebuild(dispatcher)
    wait_until(lambda: default_pool(admin)["live_workers"] == 1)

    # Only the plain worker: the kind's jobs wait, uncharged; the kinds it has still run.
    waiting = [submit(client, "text.upper", {"text": f"a{i}"})["id"] for i in range(3)]
    echo = submit(client, "echo", {"n": 1})["id"]
    assert wait_terminal(client, echo)["status"] == "succeeded"
    said = [{"kind": "text.upper", "queued": 3}]
    with contextlib.suppress(TimeoutError):  # the jobs' own states say more, below
        wait_until(lambda: default_pool(admin).get("waiting_kinds") == said, timeout=15)
    bodies = [client.get(f"/v1/jobs/{job_id}").json() for job_id in waiting]
    assert [(b["status"], b["starts"], b["error"]) for b in bodies] == [
        ("queued", 0, None)] * 3, bodies
    assert default_pool(admin)["waiting_kinds"] == said

    # A worker that runs the kind starts: the waiting jobs run there, and so do later ones.
    capable = system.start("capable", "worker", "--concurrency", "2")
    later = [submit(client, "text.upper", {"text": f"b{i}"})["id"] for i in range(6)]
    others = [submit(client, "echo", {"n": i})["id"] for i in range(4)]
    for i, job_id in enumerate([*waiting, *later]):
        body = wait_terminal(client, job_id)
        assert (body["status"], body["starts"], body["error"]) == ("succeeded", 1, None), body
        result = client.get(f"/v1/jobs/{job_id}/result").json()["result"]
        assert result == {"text": f"{'a' if i < 3 else 'b'}{i if i < 3 else i - 3}".upper(),
                          "pid": capable.popen.pid}
    assert all(wait_terminal(client, job_id)["status"] == "succeeded" for job_id in others)
    assert default_pool(admin)["waiting_kinds"] == []
