"""Run tierq as real processes (API, dispatcher, Celery worker) and talk to it over HTTP.

A ``System`` runs on the Redis broker (the Redis of ``TIERQ_REDIS_URL``) unless its
``Broker`` says RabbitMQ; then its queues and exchanges are named after its key prefix and
are deleted by name afterwards (``Broker.delete_owned``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from jobs.process.settings import DEFAULT_TIERS
from tests.services import RabbitServer
from workers.broker import BrokerNames, broker_names

ADMIN_KEY = "e2e-admin-key-of-the-tests"
TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(predicate: Callable[[], Any], *, timeout: float = 30.0, every: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.TransportError):
            value = predicate()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(every)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(5)


@dataclass
class System:
    """A tierq deployment of separate processes sharing one database, Redis and prefix."""

    env: dict[str, str]
    workdir: Path
    port: int = field(default_factory=free_port)
    processes: dict[str, Process] = field(default_factory=dict)
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Process:
        """Start ``tierq <args>`` as ``name``; ``env`` adds to (or overrides) the system's."""
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:  # the child keeps its own copy of the descriptor
            popen = subprocess.Popen(
                [sys.executable, "-m", "jobs.cli", *args],
                env={**self.env, **(env or {})},
                cwd=self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = Process(name=name, popen=popen, log=log)
        self.processes[name] = process
        return process

    def start_api(self) -> Process:
        """The API on ``port``, once it says it bound it and answers. ``free_port`` found the
        port free a moment ago, no more: one another test's process took meanwhile is given
        up for a new one (else that process would answer for this system)."""
        for _ in range(3):
            process = self.start("api", "api", "--host", "127.0.0.1", "--port", str(self.port))
            bound = f"Uvicorn running on http://127.0.0.1:{self.port}"
            wait_until(lambda p=process, b=bound: p.popen.poll() is not None
                       or b in p.log.read_text(errors="replace"))
            if process.popen.poll() is None:
                wait_until(lambda: httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200)
                return process
            self.port = free_port()
        raise RuntimeError(f"the API did not start:\n{self.logs()}")

    def start_all(self, *, concurrency: int) -> None:
        self.start_api()
        self.start("dispatcher", "dispatcher")
        self.start("worker", "worker", "--concurrency", str(concurrency))

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for process in reversed(list(self.processes.values())):
            process.stop()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.log.read_text(errors='replace')[-4000:]}"
            for p in self.processes.values()
        )

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10
        )

    def tenant(self, name: str, tier: str) -> httpx.Client:
        with self.admin() as admin:
            response = admin.post("/v1/admin/tenants", json={"name": name, "tier": tier})
            response.raise_for_status()
            key = response.json()["api_key"]
        client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        self.clients.append(client)
        return client

    def wait_for_capacity(self, client: httpx.Client, slots: int) -> None:
        wait_until(lambda: client.get("/v1/queues").json()["pool"]["capacity"] >= slots)

    def wait_for_rebuild(self, dispatcher: Process) -> None:
        """Until ``dispatcher`` leads and has built the index: the submits' and the slots'
        own leases (``offer``, ``hand_over``) wait for that."""
        wait_until(lambda: '"index.rebuilt"' in dispatcher.log.read_text(errors="replace"))


@dataclass
class Broker:
    """The broker of a System: ``redis`` (no ``rabbit``) or ``rabbitmq``."""

    name: str
    rabbit: RabbitServer | None = None
    # (key prefix, tiers) of each deployment built on it: what to delete afterwards.
    owned: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {"TIERQ_BROKER_URL": self.rabbit.url} if self.rabbit is not None else {}

    def names(self, key_prefix: str) -> BrokerNames | None:
        """The deployment's RabbitMQ names (None on Redis: its keys go with the prefix)."""
        return None if self.rabbit is None else broker_names(self.rabbit.url, key_prefix)

    def own(self, key_prefix: str, config: str) -> None:
        """Note a deployment on ``key_prefix`` with this TOML ``config``, for deletion."""
        tiers = list(tomllib.loads(config).get("tiers") or DEFAULT_TIERS)
        self.owned.append((key_prefix, tiers))

    def delete_owned(self) -> None:
        """Delete, by name, the queues and exchanges of every deployment noted (RabbitMQ has
        no key prefix to sweep, and these are durable: they would outlive the test)."""
        for key_prefix, tiers in self.owned:
            names = self.names(key_prefix)
            if names is not None and self.rabbit is not None:
                self.rabbit.delete(queues=names.queues(tiers), exchanges=names.exchanges())
        self.owned.clear()


def stop_up(up: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM a ``tierq up`` (started in a session of its own) and wait for it; past
    ``grace``, SIGKILL its whole session and fail."""
    up.send_signal(signal.SIGTERM)
    try:
        up.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        raise


def system_env(
    *, database_url: str, redis_url: str, key_prefix: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env.update(
        TIERQ_DATABASE_URL=database_url,
        TIERQ_REDIS_URL=redis_url,
        TIERQ_KEY_PREFIX=key_prefix,
        TIERQ_ADMIN_KEY=ADMIN_KEY,
        # A model is loaded by the first job that needs it, not by every worker the tests
        # start (the warm start has its own test: tests/integration/test_warm_workers.py).
        TIERQ_WORKER_SETUP="lazy",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


@contextlib.contextmanager
def started_system(
    workdir: Path, *, config: str, concurrency: int, database_url: str, redis_url: str,
    key_prefix: str,
) -> Iterator[System]:
    """API, dispatcher and a worker of ``concurrency`` slots, with ``config`` as their TOML
    file in ``workdir``; stopped afterwards (their logs printed when the test fails)."""
    path = workdir / "tierq.toml"
    path.write_text(config)
    env = system_env(database_url=database_url, redis_url=redis_url, key_prefix=key_prefix,
                     extra={"TIERQ_CONFIG": str(path)})
    with running(System(env=env, workdir=workdir)) as system:
        system.start_all(concurrency=concurrency)
        yield system


@contextlib.contextmanager
def running(system: System) -> Iterator[System]:
    try:
        yield system
    except BaseException:
        sys.stderr.write(system.logs())
        raise
    finally:
        system.stop()


def wait_terminal(client: httpx.Client, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", params={"wait": 5}).json()
        return body if body["status"] in TERMINAL else None

    result: dict[str, Any] = wait_until(done, timeout=timeout, every=0)
    return result


def wait_status(client: httpx.Client, job_id: str, status: str, timeout: float = 30.0) -> None:
    wait_until(lambda: client.get(f"/v1/jobs/{job_id}").json()["status"] == status, timeout=timeout)


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (ends before starts at equal times)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running_now = peak = 0
    for _, delta in events:
        running_now += delta
        peak = max(peak, running_now)
    return peak


def start_up(cwd: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    """``tierq up ARGS`` in a session of its own; returns it and the lines it printed up to
    and including "tierq is up" (read as they come)."""
    up = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "up", *args], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    assert up.stdout is not None
    lines: list[str] = []
    for line in up.stdout:
        lines.append(line.rstrip("\n"))
        if "tierq is up" in line:
            break
    else:
        raise AssertionError("tierq up ended before it was up:\n" + "\n".join(lines))
    return up, lines


def drain(up: subprocess.Popen[str], lines: list[str]) -> Callable[[], None]:
    """Keep reading what ``up`` prints (a full pipe would block it) into ``lines``; returns
    what to call once it has stopped: it reads the rest and closes the pipe."""
    import threading

    assert up.stdout is not None
    stream = up.stdout

    def read() -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def done() -> None:
        reader.join(15)
        stream.close()

    return done
