"""``tierq up``: the whole system on one machine, as children of a ``Supervisor``
(``jobs.local.supervisor``).

``run_up`` wires it together: data directory, embedded Redis, admin key, migrations, then
the API, the dispatcher and a worker. It refuses a port already in use before starting
anything, writes ``up.json`` in the data directory once its own API answers ``/readyz``, so
that every other command finds this system (and no other), and says "up" only once a worker
of every pool it started is live (registered in the index) and the dispatcher has built the
index: a first job then starts at once. Meanwhile it says what it waits for: the setup of
the handlers that have one (a model to load). SIGINT, SIGTERM and SIGHUP (a closed terminal)
all stop it the same orderly way.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from jobs.core.errors import ConfigError, TierqError
from jobs.local.banner import derived_lines, print_banner
from jobs.local.supervisor import ChildSpec, Supervisor
from jobs.process.settings import Settings


@dataclass(frozen=True, kw_only=True)
class UpOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    concurrency: int = 2
    data_dir: Path = Path(".tierq")
    grace_s: float = 10.0
    # The pools to start a worker for (``concurrency`` slots each): ``default`` first.
    pools: tuple[str, ...] = ("default",)
    extra_env: Mapping[str, str] = field(default_factory=dict)


def admin_key(configured: str | None, data_dir: Path) -> str:
    """The configured admin key, else the one in ``<data_dir>/admin.key`` (made once, 0600)."""
    if configured:
        return configured
    path = data_dir / "admin.key"
    if path.exists():
        return path.read_text().strip()
    key = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key


def worker_child(pool: str) -> str:
    """The name of the child that runs ``pool``'s worker."""
    return "worker" if pool == "default" else f"worker-{pool}"


def app_children(options: UpOptions, env: Mapping[str, str]) -> list[ChildSpec]:
    base = [sys.executable, "-m", "jobs.cli"]
    return [
        ChildSpec(
            name="api",
            argv=[*base, "api", "--host", options.host, "--port", str(options.port)],
            env=env,
        ),
        ChildSpec(name="dispatcher", argv=[*base, "dispatcher"], env=env),
        *(ChildSpec(
            name=worker_child(pool),
            argv=[*base, "worker", "--concurrency", str(options.concurrency), "--pool", pool],
            env=env,
        ) for pool in options.pools),
    ]


@contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """SIGINT, SIGTERM and SIGHUP set the returned event instead of interrupting."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class StartFailed(TierqError):
    """A part of ``tierq up`` could not start; everything started is stopped again."""


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another process listens on: otherwise that process would answer our
    readiness check, and our API would restart forever."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"port {port} on {host} is not free ({exc.strerror}): another program (maybe "
                "another `tierq up`) listens there; pass --port"
            ) from None


def local_url(host: str, port: int) -> str:
    """The URL this machine reaches the API at (a wildcard address is not one to dial)."""
    dial = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{dial}]:{port}" if ":" in dial else f"http://{dial}:{port}"


def wait_ready(url: str, *, alive: Callable[[], bool], stop: threading.Event,
               timeout_s: float = 120.0) -> bool:
    """Until ``url``/readyz answers 200: True; False when stopped meanwhile. Raises
    ``StartFailed`` when the API process exits or the time is up."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        if not alive():
            raise StartFailed("the API exited while starting (its log is above)")
        try:
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise StartFailed(f"the API did not answer {url}/readyz within {timeout_s:g} s")
        stop.wait(0.2)
    return False


def setup_kinds(settings: Settings, pools: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The kinds of ``pools`` whose handler sets up before its worker registers (a model to
    load): what a worker's start waits for. Read from the handlers the workers will load
    (their entry points and ``TIERQ_HANDLERS``); none when they set up lazily, or when the
    handlers cannot be loaded here (the worker says why, in its log)."""
    from jobs.execution.registry import HANDLERS_ENV, default_registry

    if settings.worker_setup != "eager":
        return []
    try:
        registry = default_registry(env.get(HANDLERS_ENV, ""))
    except ConfigError:
        return []
    every = settings.pool_set()
    return sorted(kind for pool in pools for kind in every.kinds_of(pool, registry.kinds())
                  if callable(getattr(registry.get(kind), "setup", None)))


def waiting_line(kinds: Sequence[str], pools: Sequence[str]) -> str:
    """What ``tierq up`` says while its workers start."""
    who = "the worker" if len(pools) == 1 else f"the workers of {', '.join(pools)}"
    if not kinds:
        return f"waiting for {who} to start…"
    return f"waiting for {who}: loading models for {', '.join(kinds)}…"


def wait_workers(settings: Settings, redis_url: str, pools: Sequence[str], *,
                 supervisor: Supervisor, stop: threading.Event) -> bool:
    """Until each of ``pools`` has its own worker live (registered under the pid of the
    child that runs it: a registration a killed run left in the data directory's Redis
    does not count) and the dispatcher has built each pool's index: True; False when stopped
    meanwhile. The children are supervised meanwhile (a worker that exits while it sets up
    starts again); raises ``StartFailed`` when the API exits."""
    from redis import RedisError

    from jobs.index.base import LiveWorker
    from jobs.index.redis_index import RedisIndex
    from jobs.process.runtime import redis_client

    client = redis_client(redis_url)
    indexes = [RedisIndex(client, settings.pool_prefix(pool), root=settings.key_prefix)
               for pool in pools]

    def own(pool: str, workers: Sequence[LiveWorker]) -> bool:
        pid = supervisor.pid(worker_child(pool))
        return pid is not None and any(w.worker_id.startswith(f"tierq-{pid}-") for w in workers)

    def ready() -> bool:
        try:
            return all(index.generation() is not None and own(pool, index.live_workers())
                       for pool, index in zip(pools, indexes, strict=True))
        except RedisError:
            return False

    try:
        while not stop.is_set():
            supervisor.run_once()
            if not supervisor.alive("api"):
                raise StartFailed("the API exited while the workers started (its log is above)")
            if ready():
                return True
            stop.wait(0.1)
        return False
    finally:
        client.close()


def run_up(options: UpOptions, console: Console) -> None:
    """Run everything until SIGINT/SIGTERM/SIGHUP, then stop it all (the embedded Redis last;
    workers get ``grace_s`` to finish or hand back their jobs)."""
    # Alembic announces its plugins as it is imported: not news to someone starting tierq.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    from jobs.local.embedded_redis import EmbeddedRedis
    from jobs.process.settings import UP_FILE, load_settings, write_up_file
    from jobs.store.migrate import upgrade

    check_port_free(options.host, options.port)
    data_dir = options.data_dir.resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings = load_settings(data_dir=data_dir)
    env = {**os.environ, **options.extra_env, "TIERQ_DATA_DIR": str(data_dir)}
    env["PYTHONUNBUFFERED"] = "1"
    # Workers hand back what they cannot finish before the supervisor's SIGKILL.
    env["TIERQ_POLICY__STOP_GRACE_S"] = repr(options.grace_s)
    url = local_url(options.host, options.port)
    supervisor = Supervisor(grace_s=options.grace_s)
    with _stop_signals() as stop:
        try:
            if not settings.redis_url:
                redis = EmbeddedRedis(data_dir=data_dir)
                argv = redis.prepare()
                supervisor.add(ChildSpec(name="redis", argv=argv, stop_phase=1,
                                         death_signal=signal.SIGTERM))
                redis.wait_ready(alive=lambda: supervisor.alive("redis"))
                env["TIERQ_REDIS_URL"] = redis.url
            database_url = settings.resolved_database_url(create=True)
            env["TIERQ_DATABASE_URL"] = database_url
            env["TIERQ_ADMIN_KEY"] = admin_key(settings.admin_key, data_dir)
            upgrade(database_url)
            if stop.is_set():
                return
            for spec in app_children(options, env):
                supervisor.add(spec)
            if not wait_ready(url, alive=lambda: supervisor.alive("api"), stop=stop):
                return
            write_up_file(data_dir, api_url=url)  # other commands find it from now on
            console.print(waiting_line(setup_kinds(settings, options.pools, env),
                                       options.pools),
                          highlight=False, markup=False, soft_wrap=True)
            redis_url = env.get("TIERQ_REDIS_URL") or settings.resolved_redis_url()
            if not wait_workers(settings, redis_url, options.pools, supervisor=supervisor,
                                stop=stop):
                return
            print_banner(console, options, data_dir, url, settings.admin_key is None)
            for line in derived_lines(settings, options):
                console.print(line, highlight=False, markup=False, soft_wrap=True)
            supervisor.run_until(stop)
            console.print(f"stopping (running jobs get up to {options.grace_s:g} s)…")
        finally:
            (data_dir / UP_FILE).unlink(missing_ok=True)
            supervisor.stop()


