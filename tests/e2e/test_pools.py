"""Pools on real processes: an API, a dispatcher and workers of two pools, one PostgreSQL,
one Redis. A job of a pool's kind runs only on a worker of that pool; each pool's bound and
caps refuse and hold as a tier's do, one pool not touching the other."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.e2e.harness import (
    System,
    max_overlap,
    running,
    system_env,
    wait_status,
    wait_terminal,
    wait_until,
)
from tests.e2e.test_system import submit, ts
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def deployment(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
) -> Callable[[str], System]:
    """A not yet started System whose processes also load ``nap``, a second slow kind."""

    def build(config: str) -> System:
        path = tmp_path / "tierq.toml"
        path.write_text(config)
        env = system_env(database_url=pg_url, redis_url=redis_server.url,
                         key_prefix=key_prefix, extra={
                             "TIERQ_CONFIG": str(path), "PYTHONPATH": str(ROOT),
                             "TIERQ_HANDLERS": "tests.handlers_for_tests:POOL_HANDLERS"})
        return System(env=env, workdir=tmp_path)

    return build


def pool_of(queues: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in queues["pools"] if p["pool"]["name"] == name)
    return found


SCALE_FROM_ZERO = """
[policy]
mean_service_s = 0.5
[pools.gpu]
kinds = ["nap"]
concurrency = 2
"""


def test_a_pools_job_waits_for_a_worker_of_its_pool_then_runs_there(
    deployment: Callable[[str], System],
) -> None:
    with running(deployment(SCALE_FROM_ZERO)) as system:
        system.start_api()
        system.start("dispatcher", "dispatcher")
        system.start("worker", "worker", "--concurrency", "2")  # the default pool's only
        client = system.tenant("acme", "standard")
        admin = system.admin()
        system.clients.append(admin)
        wait_until(lambda: pool_of(admin.get("/v1/queues").json(), "default")["pool"][
            "live_workers"] == 1)

        # Accepted against the gpu pool's configured capacity, with no worker of it alive.
        napping = submit(client, "nap", {"seconds": 0.1})
        gpu = pool_of(admin.get("/v1/queues").json(), "gpu")
        # Its configured capacity may lease the job for a worker still to come: queued or
        # in flight, it is the gpu pool's.
        figures = {k: gpu["pool"][k] for k in ("name", "kinds", "live_workers", "capacity")}
        assert figures == {"name": "gpu", "kinds": ["nap"], "live_workers": 0, "capacity": 2}
        assert gpu["pool"]["service_rate"] == pytest.approx(4.0)
        assert sum(tier["queued"] for tier in gpu["tiers"]) + gpu["pool"]["inflight"] >= 1
        # The default pool's idle worker runs its own kinds and never the gpu pool's.
        slept = submit(client, "sleep", {"seconds": 0.1})
        assert wait_terminal(client, slept["id"])["status"] == "succeeded"
        time.sleep(1.0)
        assert client.get(f"/v1/jobs/{napping['id']}").json()["status"] == "queued"

        system.start("worker-gpu", "worker", "--pool", "gpu", "--concurrency", "1")
        done = wait_terminal(client, napping["id"])
        assert done["status"] == "succeeded"
        workers = admin.get("/v1/admin/workers").json()
        assert sorted(w["pool"] for w in workers["workers"]) == ["default", "gpu"]
        assert workers["slots_by_pool"] == {"default": 2, "gpu": 1}
        logs = {name: system.processes[name].log.read_text(errors="replace")
                for name in ("worker", "worker-gpu")}
        assert napping["id"] in logs["worker-gpu"] and napping["id"] not in logs["worker"]
        assert slept["id"] in logs["worker"] and slept["id"] not in logs["worker-gpu"]


TWO_POOLS = """
[policy]
pool_concurrency = 4
mean_service_s = 0.5
[tiers.free]
base_priority = 20
max_wait_s = 30
tenant_share = 0.5
queued_share = 1.0
[pools.gpu]
kinds = ["nap"]
concurrency = 1
mean_service_s = 10.0
"""


def test_each_pools_bound_and_caps_hold_and_one_pool_never_touches_the_other(
    deployment: Callable[[str], System],
) -> None:
    with running(deployment(TWO_POOLS)) as system:
        system.start_api()
        system.start("dispatcher", "dispatcher")
        system.start("worker", "worker", "--concurrency", "4")
        system.start("worker-gpu", "worker", "--pool", "gpu", "--concurrency", "1")
        client = system.tenant("crowd", "free")
        admin = system.admin()
        system.clients.append(admin)
        wait_until(lambda: all(p["pool"]["live_workers"] == 1
                               for p in admin.get("/v1/queues").json()["pools"]))

        # gpu: μ = 1 slot / 10 s; bound floor(0.1 × 30) = 3 queued; cap max(1, 0.5) = 1.
        first = submit(client, "nap", {"seconds": 2})
        wait_status(client, first["id"], "running")
        answers = [client.post("/v1/jobs", json={"kind": "nap", "payload": {"seconds": 2}})
                   for _ in range(6)]
        codes = [a.status_code for a in answers]
        assert codes == [202, 202, 202, 429, 429, 429]
        refused = answers[3]
        assert refused.json()["error"]["type"] == "capacity"
        assert refused.headers["x-tier"] == "free"
        # default: μ = 4 / 0.5 s, bound 240, cap floor(4 × 0.5) = 2: the gpu pool's full
        # queue refuses nothing here, and its backlog delays nothing here.
        sleeps = [submit(client, "sleep", {"seconds": 0.5}) for _ in range(4)]
        finished = [wait_terminal(client, s["id"]) for s in sleeps]
        assert {f["status"] for f in finished} == {"succeeded"}
        intervals = [(ts(f["started_at"]), ts(f["finished_at"])) for f in finished]
        assert max_overlap(intervals) == 2
        queues = admin.get("/v1/queues").json()
        gpu, default = pool_of(queues, "gpu"), pool_of(queues, "default")
        assert (gpu["tiers"][0]["bound"], gpu["tiers"][0]["tenant_cap"]) == (3, 1)
        assert (default["tiers"][0]["bound"], default["tiers"][0]["tenant_cap"]) == (240, 2)
        assert gpu["tiers"][0]["queued"] >= 1  # the gpu backlog still waits its turn
        naps = [first, *(a.json() for a in answers[:3])]
        done = [wait_terminal(client, n["id"], timeout=60) for n in naps]
        assert {d["status"] for d in done} == {"succeeded"}
        assert max_overlap([(ts(d["started_at"]), ts(d["finished_at"])) for d in done]) == 1
        metrics = httpx.get(f"{system.url}/metrics", timeout=10).text
        assert 'tierq_queue_bound{pool="gpu",tier="free"} 3.0' in metrics
        assert 'tierq_pool_capacity{pool="default"} 4.0' in metrics


def test_a_worker_refuses_to_join_a_pool_whose_kinds_it_cannot_run(tmp_path: Path) -> None:
    config = tmp_path / "tierq.toml"
    config.write_text('[pools.gpu]\nkinds = ["sleep", "no.such.kind"]\n')
    env = system_env(database_url="sqlite:///" + str(tmp_path / "x.db"),
                     redis_url="redis://127.0.0.1:1", key_prefix="{tierq-none}:",
                     extra={"TIERQ_CONFIG": str(config)})
    joins = subprocess.run([sys.executable, "-m", "jobs.cli", "worker", "--pool", "gpu"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert joins.returncode == 2, joins.stderr
    assert "pool 'gpu' runs no.such.kind, which this worker has no handler for" in (
        joins.stderr.replace("\n", " "))
    unknown = subprocess.run([sys.executable, "-m", "jobs.cli", "worker", "--pool", "tpu"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2
    assert "no pool 'tpu' is configured; configured: default, gpu" in (
        unknown.stderr.replace("\n", " "))
