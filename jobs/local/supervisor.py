"""``tierq up``: the whole system on one machine, as supervised child processes.

``Supervisor`` starts children, restarts one that dies (1 s backoff doubling to 30 s, reset
after 60 s of good running) and stops them all: SIGTERM to each child's process group, a
grace period, then SIGKILL. Children stop in phases (the embedded Redis last, so the others
can finish their last writes). Each child runs in its own process group, so a Ctrl-C at the
terminal reaches only the supervisor, which then stops the children in order; on Linux each
child also gets ``PR_SET_PDEATHSIG``, so none outlives a supervisor that is killed outright.

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

import ctypes
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from jobs.core.errors import ConfigError, TierqError
from jobs.local.banner import derived_lines, print_banner
from jobs.process.settings import Settings

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, kw_only=True)
class ChildSpec:
    """One supervised command."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    # Lower phases stop first; children of one phase stop together.
    stop_phase: int = 0
    # Sent by the kernel if the supervisor dies without stopping it (Linux).
    death_signal: int = signal.SIGKILL


@dataclass(frozen=True, kw_only=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 30.0
    # A child that ran this long before dying starts again from ``initial_s``.
    reset_after_s: float = 60.0

    def delay_s(self, failures: int) -> float:
        return min(self.max_s, self.initial_s * 2.0 ** max(0, failures - 1))


@dataclass(frozen=True, kw_only=True)
class RunStats:
    exited: tuple[str, ...] = ()
    started: tuple[str, ...] = ()


@dataclass
class _Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None


def _log(level: int, event: str, **fields: Any) -> None:
    logger.log(level, event, extra={"event": event, **fields})


def _death_signal_hook(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to send ``sig`` when the parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


class Supervisor:
    """Starts, watches, restarts and stops child processes; driven by ``run_once``."""

    def __init__(
        self,
        *,
        backoff: Backoff | None = None,
        grace_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff = backoff or Backoff()
        self.grace_s = grace_s
        self.clock = clock
        self._children: list[_Child] = []
        self._stopping = False

    def add(self, spec: ChildSpec) -> int:
        """Start ``spec`` now and supervise it; returns its pid."""
        child = _Child(spec=spec)
        self._children.append(child)
        self._start(child, self.clock())
        assert child.process is not None
        return child.process.pid

    def _start(self, child: _Child, now: float) -> None:
        spec = child.spec
        child.process = subprocess.Popen(
            list(spec.argv),
            env=dict(spec.env) if spec.env is not None else None,
            process_group=0,
            preexec_fn=_death_signal_hook(spec.death_signal),
        )
        child.started_at = now
        child.restart_at = None
        _log(logging.INFO, "child.started", child=spec.name, pid=child.process.pid)

    def pid(self, name: str) -> int | None:
        for child in self._children:
            if child.spec.name == name and child.process is not None:
                return child.process.pid
        return None

    def pids(self) -> dict[str, int]:
        return {c.spec.name: c.process.pid for c in self._children if c.process is not None}

    def alive(self, name: str) -> bool:
        return any(
            c.spec.name == name and c.process is not None and c.process.poll() is None
            for c in self._children
        )

    def run_once(self, now: float | None = None) -> RunStats:
        """Reap children that died (scheduling their restart) and start those that are due."""
        now = self.clock() if now is None else now
        exited: list[str] = []
        started: list[str] = []
        for child in self._children:
            if child.process is not None and child.process.poll() is not None:
                self._schedule_restart(child, now)
                exited.append(child.spec.name)
            due = child.restart_at is not None and now >= child.restart_at
            if child.process is None and due and not self._stopping:
                try:
                    self._start(child, now)
                    started.append(child.spec.name)
                except OSError as exc:
                    _log(logging.ERROR, "child.start_failed", child=child.spec.name, error=str(exc))
                    child.started_at = now
                    self._schedule_restart(child, now)
        return RunStats(exited=tuple(exited), started=tuple(started))

    def _schedule_restart(self, child: _Child, now: float) -> None:
        returncode = child.process.returncode if child.process is not None else None
        if now - child.started_at >= self.backoff.reset_after_s:
            child.failures = 0
        child.failures += 1
        delay = self.backoff.delay_s(child.failures)
        child.process = None
        child.restart_at = now + delay
        _log(
            logging.WARNING,
            "child.exited",
            child=child.spec.name,
            returncode=returncode,
            restart_in_s=delay,
        )

    def run_until(self, stop: threading.Event, *, period_s: float = 0.5) -> None:
        while not stop.is_set():
            self.run_once()
            stop.wait(period_s)

    def stop(self, grace_s: float | None = None) -> dict[str, int | None]:
        """Stop every child, phase by phase: SIGTERM, up to ``grace_s``, then SIGKILL.
        Returns each stopped child's exit status (negative: the signal that ended it)."""
        self._stopping = True
        grace = self.grace_s if grace_s is None else grace_s
        codes: dict[str, int | None] = {}
        for phase in sorted({c.spec.stop_phase for c in self._children}):
            group = [c for c in self._children if c.spec.stop_phase == phase]
            codes.update(self._stop_group(group, grace))
        return codes

    def _stop_group(self, group: list[_Child], grace_s: float) -> dict[str, int | None]:
        running = [c.process for c in group if c.process is not None]
        for process in running:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _log(logging.WARNING, "child.killed", pid=process.pid, grace_s=grace_s)
                _signal_group(process, signal.SIGKILL)
                process.wait()
        codes: dict[str, int | None] = {}
        for child in group:
            if child.process is not None:
                codes[child.spec.name] = child.process.returncode
                _log(logging.INFO, "child.stopped", child=child.spec.name,
                     returncode=child.process.returncode)
            child.process = None
            child.restart_at = None
        return codes


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the child's whole process group while the child is not yet reaped (its pid,
    and so its group id, cannot have been reused)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


# --- tierq up -------------------------------------------------------------------------


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


