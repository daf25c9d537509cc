"""End to end: a batch runs to completion through real processes (API, dispatcher, Celery
worker on PostgreSQL + Redis) while another tenant submits single jobs.

The batch is fed into the live queue as room allows, so the other tenant's jobs never queue
behind it: each one starts while the batch still has items waiting. No item is lost: every
index comes back in the results exactly once. The first test runs a 4,000-item batch, long
enough to outlast the other tenant's five jobs many times over; bench/batches.py measures the
same run at 20,000 items (items accepted per second, the single jobs' wait beside the batch
and without it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs.client.http import Client
from tests.e2e.harness import Broker, System, running, system_env, wait_terminal, wait_until
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ITEMS = 4_000
CONFIG = """
[policy]
mean_service_s = 0.01
[tiers.standard]
base_priority = 10
max_wait_s = 20
tenant_share = 0.5
"""
# The batch tenant runs on 2 of the 4 slots (tenant_share) and may hold QUOTA items queued
# (its own override, so the measured service time cannot lift it): the feeder admits the
# batch a few items at a time.
QUOTA = 20


@pytest.fixture
def deployment(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, key_prefix: str,
    redis_client: redis.Redis, broker: Broker,
) -> Callable[[str], System]:
    def build(config: str) -> System:
        path = tmp_path / "tierq.toml"
        path.write_text(config)
        broker.own(key_prefix, config)
        env = system_env(database_url=pg_url, redis_url=redis_server.url,
                         key_prefix=key_prefix, extra={"TIERQ_CONFIG": str(path)})
        return System(env=env, workdir=tmp_path)

    return build


def test_a_batch_completes_beside_single_jobs_that_do_not_wait_behind_it(
    deployment: Callable[[str], System],
) -> None:
    with running(deployment(CONFIG)) as system:
        system.start_all(concurrency=4)
        bulk = system.tenant("bulk", "standard")
        single = system.tenant("single", "standard")
        with system.admin() as admin:
            tenants = admin.get("/v1/admin/tenants").json()["tenants"]
            bulk_id = next(t["id"] for t in tenants if t["name"] == "bulk")
            patched = admin.patch(f"/v1/admin/tenants/{bulk_id}", json={"max_queued": QUOTA})
            assert patched.status_code == 200, patched.text
        system.wait_for_capacity(single, 4)
        key = str(bulk.headers["Authorization"]).removeprefix("Bearer ")
        with Client(system.url, key, timeout=60) as client:
            batch = client.submit_batch("echo", ({"i": i} for i in range(ITEMS)))
            assert batch["total"] == ITEMS and batch["status"] == "accepted"
            batch_id = batch["id"]
            wait_until(lambda: client.batch(batch_id)["counts"]["succeeded"] > 0, timeout=60)
            waiting_after, singles = [], []
            for n in range(5):
                response = single.post("/v1/jobs", json={"kind": "echo", "payload": {"n": n}})
                assert response.status_code == 202, response.text
                job = wait_terminal(single, response.json()["id"])
                assert job["status"] == "succeeded"
                singles.append(job)
                waiting_after.append(client.batch(batch_id)["counts"]["waiting"])
            final = wait_until(lambda: _finished(client.batch(batch_id)), timeout=480, every=1.0)
            lines = list(client.batch_results(batch_id))
            items = _all_jobs(bulk)

    # The batch was still being fed when each single job had finished: the scenario holds.
    assert all(waiting > 0 for waiting in waiting_after), waiting_after
    # Each single job was overtaken only by the batch items that started on the batch's own
    # two slots while it waited for its start (a few, or a few dozen of these ~10 ms items on
    # a loaded machine), not by the batch's backlog: behind that it would have waited for
    # every item still waiting when it ended, thousands.
    starts = sorted(ts(job["started_at"]) for job in items)
    for job, waiting in zip(singles, waiting_after, strict=True):
        overtaken_by = sum(ts(job["enqueued_at"]) < s < ts(job["started_at"]) for s in starts)
        assert overtaken_by < min(200, waiting), (overtaken_by, waiting, job)
    assert final["counts"]["succeeded"] == ITEMS, final
    assert final["finished_at"] is not None and final["estimated_finish_s"] == 0.0
    assert [line["index"] for line in lines] == list(range(ITEMS))
    assert len({line["job_id"] for line in lines}) == ITEMS
    assert all(line["status"] == "succeeded" and line["result"] == {"i": line["index"]}
               for line in lines)


def ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def _all_jobs(client: Any) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params).json()
        jobs += page["jobs"]
        cursor = page.get("next_cursor")
        if not cursor:
            return jobs


def _finished(state: dict[str, Any]) -> dict[str, Any] | None:
    return state if state["status"] == "finished" else None


def test_the_cli_submits_a_batch_and_prints_its_results(
    deployment: Callable[[str], System], tmp_path: Path,
) -> None:
    items = tmp_path / "items.ndjson"
    items.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(20)))
    with running(deployment(CONFIG)) as system:
        system.start_all(concurrency=2)
        tenant = system.tenant("cli", "standard")
        key = str(tenant.headers["Authorization"]).removeprefix("Bearer ")
        env = {**system.env, "TIERQ_API_URL": system.url, "TIERQ_API_KEY": key}
        submitted = _tierq(env, tmp_path, "batch", "submit", str(items), "--kind", "echo",
                           "--wait")
        assert submitted.returncode == 0, submitted.stderr
        batch_id = submitted.stdout.split()[1]
        printed = _tierq(env, tmp_path, "batch", "results", batch_id)
        bad = _tierq(env, tmp_path, "batch", "submit", str(items), "--kind", "no.such")
    assert printed.returncode == 0, printed.stderr
    rows = [json.loads(line) for line in printed.stdout.splitlines()]
    assert [row["result"] for row in rows] == [{"i": i} for i in range(20)]
    # One line naming what it acts on, one line saying why not: no traceback.
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("not submitted: 422 invalid_request")
    assert "Traceback" not in bad.stderr


def _tierq(env: dict[str, str], cwd: Path, *args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)



def test_a_batch_survives_its_dispatcher_being_killed(
    deployment: Callable[[str], System],
) -> None:
    """Killed mid-batch (SIGKILL: no resignation), the dispatcher's successor carries on from
    SQL: every item ends, each exactly once in the results."""
    items = 200
    # A short lease: an item the killed leader had leased but not yet published comes back
    # after it, not after the default 30 s.
    config = CONFIG.replace("[policy]\n", "[policy]\nlease_ttl_s = 3\n")
    with running(deployment(config)) as system:
        system.start_all(concurrency=4)
        bulk = system.tenant("bulk", "standard")
        with system.admin() as admin:
            tenants = admin.get("/v1/admin/tenants").json()["tenants"]
            bulk_id = next(t["id"] for t in tenants if t["name"] == "bulk")
            admin.patch(f"/v1/admin/tenants/{bulk_id}", json={"max_queued": QUOTA})
        key = str(bulk.headers["Authorization"]).removeprefix("Bearer ")
        with Client(system.url, key, timeout=60) as client:
            batch_id = client.submit_batch("echo", ({"i": i} for i in range(items)))["id"]
            wait_until(lambda: client.batch(batch_id)["counts"]["succeeded"] >= 20, timeout=60)
            system.processes["dispatcher"].kill()
            killed_at = client.batch(batch_id)["counts"]
            system.start("dispatcher-2", "dispatcher")
            final = wait_until(lambda: _finished(client.batch(batch_id)), timeout=120, every=0.5)
            lines = list(client.batch_results(batch_id))

    assert killed_at["waiting"] > 0, killed_at  # it was killed while still feeding
    assert final["counts"]["succeeded"] == items, final
    assert [line["index"] for line in lines] == list(range(items))
    assert len({line["job_id"] for line in lines}) == items
