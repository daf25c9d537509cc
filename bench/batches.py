"""Batches beside single jobs: a large batch (20,000 items by default) through real processes.

Measures how fast ``POST /v1/batches`` accepts items (one NDJSON upload, stored in one
transaction), how long the batch takes to finish on a 4-slot worker, and the queue wait
(enqueued → started) of another tenant's single jobs, submitted one after another, first
with nothing else running and then while the batch runs. The batch's tenant runs on half the
pool (``tenant_share`` 0.5): the single jobs should keep their usual wait.

    .venv/bin/python bench/batches.py [--items 20000] [--singles 100]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from e2e_stack import ADMIN_KEY, bench_redis, child, free_port, wait_until
from rich.console import Console
from rich.table import Table
from submit import postgres_admin_url, throwaway_database

CONFIG = """
[policy]
mean_service_s = 0.01

[tiers.standard]
base_priority = 10
max_wait_s = 20
tenant_share = 0.5
"""
SLOTS = 4


def ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def single_waits(http: httpx.Client, count: int) -> list[float]:
    """Queue waits (s) of ``count`` echo jobs submitted one after another."""
    waits = []
    for n in range(count):
        job_id = http.post("/v1/jobs", json={"kind": "echo", "payload": {"n": n}}).json()["id"]
        while True:
            job = http.get(f"/v1/jobs/{job_id}", params={"wait": 10}).json()
            if job["status"] in ("succeeded", "failed", "cancelled", "expired"):
                break
        waits.append(ts(job["started_at"]) - ts(job["enqueued_at"]))
    return waits


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        admin_url = stack.enter_context(postgres_admin_url())
        database_url = stack.enter_context(throwaway_database(admin_url))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tierq-batch-")))
        redis_at = stack.enter_context(bench_redis(workdir))
        config = workdir / "tierq.toml"
        config.write_text(CONFIG)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
        env.update(TIERQ_DATABASE_URL=database_url, TIERQ_REDIS_URL=redis_at.url,
                   TIERQ_ADMIN_KEY=ADMIN_KEY, TIERQ_CONFIG=str(config),
                   TIERQ_WORKER_SETUP="lazy",  # echo items need no model loaded at start
                   PYTHONUNBUFFERED="1")
        port = free_port()
        cli = [sys.executable, "-m", "jobs.cli"]
        with console.status("starting tierq (API, dispatcher, worker)"):
            stack.enter_context(child("api", [*cli, "api", "--host", "127.0.0.1", "--port",
                                              str(port), "--log-level", "warning"],
                                      env=env, workdir=workdir))
            stack.enter_context(child("dispatcher", [*cli, "dispatcher"], env=env,
                                      workdir=workdir))
            stack.enter_context(child("worker", [*cli, "worker", "--celery-pool", "threads",
                                                 "--concurrency", str(SLOTS), "--loglevel",
                                                 "WARNING"], env=env, workdir=workdir))
            url = f"http://127.0.0.1:{port}"
            wait_until("the API is ready",
                       lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, 90)
        keys = {}
        with httpx.Client(base_url=url, timeout=30,
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
            for name in ("bulk", "single"):
                made = admin.post("/v1/admin/tenants", json={"name": name, "tier": "standard"})
                keys[name] = made.json()["api_key"]
        bulk = stack.enter_context(httpx.Client(
            base_url=url, timeout=300, headers={"Authorization": f"Bearer {keys['bulk']}"}))
        single = stack.enter_context(httpx.Client(
            base_url=url, timeout=60, headers={"Authorization": f"Bearer {keys['single']}"}))
        wait_until("the worker's slots", lambda: single.get("/v1/queues").json()["pool"][
            "capacity"] >= SLOTS, 90)
        with console.status(f"{args.singles} single jobs, nothing else running"):
            figures["alone"] = single_waits(single, args.singles)
        body = b"".join(json.dumps({"i": i}).encode() + b"\n" for i in range(args.items))
        with console.status(f"uploading a batch of {args.items:,} items"):
            started = time.monotonic()
            answer = bulk.post("/v1/batches", params={"kind": "echo"}, content=body,
                               headers={"Content-Type": "application/x-ndjson"})
            figures["upload_s"] = time.monotonic() - started
        answer.raise_for_status()
        batch_id = answer.json()["id"]
        batch_started = time.monotonic()
        with console.status(f"{args.singles} single jobs while the batch runs"):
            figures["beside"] = single_waits(single, args.singles)
            figures["left_after_singles"] = bulk.get(f"/v1/batches/{batch_id}").json()["counts"]
        with console.status("waiting for the batch to finish"):
            while (state := bulk.get(f"/v1/batches/{batch_id}").json())["status"] != "finished":
                time.sleep(1)
        figures["batch_s"] = time.monotonic() - batch_started
        figures["counts"] = state["counts"]
        lines = bulk.get(f"/v1/batches/{batch_id}/results").text.splitlines()
        indexes = [json.loads(line)["index"] for line in lines]
        figures["results_complete"] = indexes == list(range(args.items))
    return figures


def report(figures: dict[str, Any], args: argparse.Namespace) -> Table:
    table = Table(title=f"a batch of {args.items:,} echo items beside single jobs "
                        f"({SLOTS} worker slots, batch tenant on half of them)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("upload (one NDJSON POST), s", f"{figures['upload_s']:.2f}")
    table.add_row("items accepted per second", f"{args.items / figures['upload_s']:,.0f}")
    table.add_row("batch finished after, s", f"{figures['batch_s']:.1f}")
    table.add_row("batch items per second", f"{args.items / figures['batch_s']:,.0f}")
    for name in ("alone", "beside"):
        waits = figures[name]
        table.add_row(f"single-job wait p50 / p95, ms ({name})",
                      f"{pct(waits, 50) * 1000:.1f} / {pct(waits, 95) * 1000:.1f}")
    table.add_row("batch items still waiting after the singles",
                  str(figures["left_after_singles"].get("waiting")))
    table.add_row("succeeded / total", f"{figures['counts']['succeeded']} / {args.items}")
    table.add_row("every index in the results once", str(figures["results_complete"]))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=20_000, help="items in the batch")
    parser.add_argument("--singles", type=int, default=100, help="single jobs per phase")
    args = parser.parse_args(argv)
    console = Console(width=110)
    console.print(report(run(args, console), args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
