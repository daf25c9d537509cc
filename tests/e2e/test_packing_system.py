"""Packing on real processes over HTTP: an API, a dispatcher and a worker of two slots that
runs ``pack`` (``tests.handlers_for_tests.PackHandler``: up to 16 items per handler call).

A free tenant at cap 1 gets its items in runs of several while never holding two slots; a
premium job that comes meanwhile starts on the free slot at once; an item whose outcome is an
error fails alone, a cancelled one ends cancelled, and a poisoned item, which breaks every run
it is in, ends failed alone after its runs were split (the others succeed, uncharged); a
worker killed mid-run leaves every item of its run to run again, none lost, none completed
twice."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.e2e.harness import System, max_overlap, running, system_env, wait_terminal, wait_until
from tests.e2e.test_system import submit
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[policy]
mean_service_s = 0.2
pool_concurrency = 2
lease_ttl_s = 3
max_attempts = 2
retry_backoff_s = 0.1
[tiers.premium]
base_priority = 100
max_wait_s = 30
tenant_share = 1.0
queued_share = 1.0
[tiers.free]
base_priority = 0
max_wait_s = 600
tenant_share = 0.01
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
                            "TIERQ_HANDLERS": "tests.handlers_for_tests:PackHandler"})
    with running(System(env=env, workdir=tmp_path)) as started:
        started.start_all(concurrency=2)
        yield started


def runs(client: redis.Redis, key: str) -> list[tuple[float, float, list[str]]]:
    out = []
    for raw in client.lrange(key, 0, -1):
        start, end, ids = raw.decode().split(" ")
        out.append((float(start), float(end), ids.split(",")))
    return out


def send(client: httpx.Client, n: int, key: str, **payload: Any) -> list[str]:
    return [submit(client, "pack", {"key": key, "seconds": 0.3, **payload})["id"]
            for _ in range(n)]


def test_a_capped_tenant_gets_full_runs_on_one_slot_and_premium_starts_at_once(
    system: System, redis_client: redis.Redis, key_prefix: str,
) -> None:
    free = system.tenant("lab", "free")
    premium = system.tenant("acme", "premium")
    system.wait_for_capacity(free, 2)
    key = f"{key_prefix}test:runs"
    ids = send(free, 64, key)
    wait_until(lambda: runs(redis_client, key), timeout=30)
    vip = submit(premium, "pack", {"key": key, "seconds": 0.1})["id"]
    ended = [wait_terminal(free, job_id) for job_id in ids]
    assert {job["status"] for job in ended} == {"succeeded"}
    assert all(job["starts"] == 1 for job in ended)
    seen = runs(redis_client, key)
    free_runs = [(s, e) for s, e, items in seen if vip not in items]
    # Runs of several items; the tenant (cap 1) never held two slots at once.
    assert max(len(items) for _, _, items in seen) > 1
    assert max_overlap(free_runs) == 1
    assert sorted(i for _, _, items in seen for i in items if i != vip) == sorted(ids)
    assert {job["run_items"] for job in ended} - {1} and all(
        1 <= job["run_items"] <= 16 for job in ended)
    # The premium job took the free slot at once, not after the free tenant's backlog.
    vip_job = wait_terminal(premium, vip)
    assert vip_job["status"] == "succeeded"
    last_free_start = max(s for s, _ in free_runs)
    assert _epoch(vip_job["started_at"]) < last_free_start
    # One Celery task per run, whose result (what Flower shows) names the run's size.
    assert "led a run of" in system.processes["worker"].log.read_text(errors="replace")


def test_an_item_fails_alone_a_cancel_ends_one_item_and_a_poison_is_split_out(
    system: System, redis_client: redis.Redis, key_prefix: str,
) -> None:
    free = system.tenant("lab", "free")
    system.wait_for_capacity(free, 2)
    key = f"{key_prefix}test:runs"
    long = send(free, 1, key, seconds=3.0)  # leads the first run, long enough to cancel in
    ok = send(free, 10, key)
    failing = send(free, 1, key, fail=True)
    poison = send(free, 1, key, poison=True)
    later = send(free, 10, key)
    cancel = ok[3]
    wait_until(lambda: free.get(f"/v1/jobs/{cancel}").json()["status"] == "running", timeout=30)
    assert free.post(f"/v1/jobs/{cancel}/cancel").status_code in (200, 202)
    ended = {job_id: wait_terminal(free, job_id, timeout=90)
             for job_id in [*long, *ok, *failing, *poison, *later]}
    assert ended[cancel]["status"] == "cancelled"
    assert ended[failing[0]]["status"] == "failed"
    assert "asked to fail" in ended[failing[0]]["error"]
    assert ended[poison[0]]["status"] == "failed"
    # Charged once, for the start in which it ran alone; its error is its own.
    assert ended[poison[0]]["starts"] == 1 and ended[poison[0]]["run_items"] == 1
    assert "poisoned" in ended[poison[0]]["error"]
    others = [job for job_id, job in ended.items()
              if job_id not in (cancel, failing[0], poison[0])]
    assert {job["status"] for job in others} == {"succeeded"}
    assert all(job["starts"] == 1 for job in others)  # split runs were not charged
    done = [i for _, _, items in runs(redis_client, key) for i in items]
    assert poison[0] not in done


def test_a_worker_killed_mid_run_leaves_every_item_to_run_again_once(
    system: System, redis_client: redis.Redis, key_prefix: str,
) -> None:
    free = system.tenant("lab", "free")
    system.wait_for_capacity(free, 2)
    key = f"{key_prefix}test:runs"
    first = send(free, 1, key, seconds=2.5)
    rest = send(free, 20, key)
    wait_until(lambda: free.get(f"/v1/jobs/{first[0]}").json()["status"] == "running",
               timeout=30)
    wait_until(lambda: free.get(f"/v1/jobs/{rest[0]}").json()["status"] == "running",
               timeout=30)
    system.processes["worker"].kill()
    system.start("worker2", "worker", "--concurrency", "2")
    ids = [*first, *rest]
    ended = [wait_terminal(free, job_id, timeout=120) for job_id in ids]
    assert {job["status"] for job in ended} == {"succeeded"}
    assert any(job["attempt"] > 1 for job in ended)  # the kill took a run down mid-way
    assert all(job["starts"] == 1 for job in ended)  # and its split was not charged
    done = [i for _, _, items in runs(redis_client, key) for i in items]
    assert sorted(done) == sorted(ids)  # each completed once, none lost


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
