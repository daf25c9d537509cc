"""What a phase of the end-to-end bench cost: SQL transactions, Redis commands, CPU, memory.

- SQL: ``xact_commit + xact_rollback`` of the bench's database in ``pg_stat_database``, read
  from the maintenance database so that reading adds nothing. Backends flush their counts
  at most once a second, and one that goes idle within a second of its last flush keeps
  them until its idle timeout, 10 s later: a reading waits that long after the work it
  counts, and the system's own idle trickle over the wait is taken off (``idle_rate``).
- Redis: ``INFO commandstats`` of the bench's own server: every command, those that Lua
  scripts run included (Redis counts both). ``MONITOR`` tells them apart (a script's
  commands show ``[0 lua]``), and shows which client sent what, and when.
- CPU: ``psutil`` user + system time of each process and its descendants; for PostgreSQL,
  of the backends connected to the bench's database (``pg_stat_activity``); for the
  client, the thread CPU time of the submitting calls themselves (``ThreadCpu``), not the
  bench's watching.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis
import sqlalchemy as sa

# Commands the bench itself sends while counting.
OWN_COMMANDS = ("cmdstat_info", "cmdstat_config|resetstat")
# PostgreSQL's idle stats timeout (PGSTAT_IDLE_INTERVAL, 10 s), and a margin: what a backend
# counted is in pg_stat_database this long after it went idle.
IDLE_FLUSH_S = 10.5


# -- SQL -------------------------------------------------------------------------------------


@dataclass
class SqlMeter:
    admin: sa.Engine  # the maintenance database, autocommit
    database: str
    # The system's own transactions per second with nothing to do, running and held (its
    # dispatcher or worker stopped): taken off the waits for the counts to be flushed.
    idle_per_s: float = 0.0
    held_per_s: float = 0.0

    def transactions(self) -> int:
        with self.admin.connect() as conn:
            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            value = conn.execute(sa.text(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :db"
            ), {"db": self.database}).scalar_one()
        return int(value)

    def flushed(self, quiet_since: float) -> int:
        """The counter with everything done until ``quiet_since`` (``time.monotonic()``)
        in it: read once every backend has had its idle timeout since."""
        time.sleep(max(0.0, quiet_since + IDLE_FLUSH_S - time.monotonic()))
        return self.transactions()

    def trickle(self, since: float, *, held: bool) -> float:
        """The idle system's own transactions from ``since`` until now."""
        return (self.held_per_s if held else self.idle_per_s) * (time.monotonic() - since)

    def backend_pids(self) -> list[int]:
        with self.admin.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT pid FROM pg_stat_activity WHERE datname = :db"), {"db": self.database})
            return [int(pid) for (pid,) in rows]


# -- Redis -----------------------------------------------------------------------------------


def redis_commands(client: redis.Redis) -> Counter[str]:
    """Calls per command so far, less the bench's own INFO and CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    return Counter({name: int(entry["calls"]) for name, entry in stats.items()
                    if name not in OWN_COMMANDS})


def redis_used_memory(client: redis.Redis, *, settle_s: float = 60.0) -> int:
    """``used_memory`` once no lazy free is pending: what an earlier phase deleted (a million
    keys' worth, by UNLINK) is freed in the background, and would count against the next."""
    deadline = time.monotonic() + settle_s
    while True:
        memory = client.info("memory")
        if int(memory.get("lazyfree_pending_objects", 0)) == 0 or time.monotonic() > deadline:
            return int(memory["used_memory"])
        time.sleep(0.05)


@dataclass(frozen=True, kw_only=True)
class Monitored:
    commands: int  # every command, Lua's included
    from_lua: int
    # Client commands, pipelined ones (sent back to back in one read) merged: ≈ round trips.
    round_trips: int
    by_client: Counter[str]  # round trips per client address ("127.0.0.1:port")


_LINE = re.compile(rb"^(\d+\.\d+) \[\d+ ([^\]]+)\]")
# Commands of one pipeline run back to back in one event-loop pass; requests that waited on
# a reply are at least a network round trip apart.
PIPELINE_GAP_S = 20e-6


def parse_monitor(path: Path, ignore: frozenset[str] = frozenset()) -> Monitored:
    """Count a MONITOR log; ``ignore`` names client addresses to leave out (the bench's)."""
    commands = from_lua = 0
    by_client: Counter[str] = Counter()
    previous_client, previous_at, script_started = "", 0.0, None
    with path.open("rb") as log:
        for line in log:
            match = _LINE.match(line)
            if match is None:
                continue
            at, source = float(match[1]), match[2].decode()
            if source in ignore:
                previous_client, script_started = "", None
                continue
            commands += 1
            if source == "lua":  # logged before the EVAL/EVALSHA that ran it
                from_lua += 1
                script_started = at if script_started is None else script_started
                continue
            started = at if script_started is None else script_started
            if source != previous_client or started - previous_at > PIPELINE_GAP_S:
                by_client[source] += 1
            previous_client, previous_at, script_started = source, at, None
    return Monitored(commands=commands, from_lua=from_lua,
                     round_trips=sum(by_client.values()), by_client=by_client)


@contextlib.contextmanager
def monitoring(cli: list[str], path: Path) -> Iterator[None]:
    """``redis-cli MONITOR`` into ``path`` while the block runs."""
    with path.open("wb") as out:
        process = subprocess.Popen([*cli, "monitor"], stdout=out, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)  # connected and subscribed before the work starts
        yield
    finally:
        time.sleep(0.2)
        process.terminate()
        process.wait(10)


def client_ports(pids: dict[str, int], redis_port: int) -> dict[str, str]:
    """``"127.0.0.1:<port>"`` → process name, for each open connection to Redis. A process
    named earlier keeps its connections from one named later (the bench's own process is
    every child's ancestor: name it last)."""
    names: dict[str, str] = {}
    for name, pid in pids.items():
        for process in _tree(pid):
            with contextlib.suppress(psutil.Error):
                for conn in process.net_connections(kind="tcp"):
                    if conn.raddr and conn.raddr.port == redis_port:
                        names.setdefault(f"{conn.laddr.ip}:{conn.laddr.port}", name)
    return names


# -- CPU and memory --------------------------------------------------------------------------


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _cpu_s(process: psutil.Process) -> float:
    with contextlib.suppress(psutil.Error):
        times = process.cpu_times()
        return times.user + times.system
    return 0.0


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """CPU seconds of each process and of each of its descendants, by pid."""
    return {p.pid: _cpu_s(p) for pid in pids for p in _tree(pid)}


def rss_bytes(pid: int) -> int:
    total = 0
    for process in _tree(pid):
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


@dataclass
class CpuMeter:
    """CPU seconds spent by named groups of processes between ``start`` and ``stop``."""

    groups: dict[str, Callable[[], list[int]]]  # name → the pids to count now

    def start(self) -> None:
        self._before = {name: cpu_by_pid(pids()) for name, pids in self.groups.items()}

    def stop(self) -> dict[str, float]:
        spent: dict[str, float] = {}
        for name, pids in self.groups.items():
            before, after = self._before[name], cpu_by_pid(pids())
            # A process that appeared meanwhile counts whole; one that ended is lost.
            spent[name] = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
        return spent


class ThreadCpu:
    """CPU seconds the client threads spend inside their calls (``time.thread_time``): what
    submitting costs the client, less the bench's own watching, which runs in other threads
    and between calls."""

    def __init__(self) -> None:
        self._spent: list[float] = []
        self._lock = threading.Lock()

    def wrap(self, make_call: Callable[[], Callable[[int], bool]],
             ) -> Callable[[], Callable[[int], bool]]:
        def make_metered() -> Callable[[int], bool]:
            call = make_call()

            def metered(n: int) -> bool:
                started = time.thread_time()
                try:
                    return call(n)
                finally:
                    self._spent.append(time.thread_time() - started)

            return metered

        return make_metered

    def take(self) -> float:
        """The seconds counted since the last ``take``."""
        with self._lock:
            spent, self._spent = self._spent, []
        return sum(spent)
