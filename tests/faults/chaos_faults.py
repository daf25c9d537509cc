"""The chaos soak's fault driver: the faults, the fleet they hit, and a timeline of both.

``Fleet`` owns the soak's processes (the API, two dispatchers, the workers) and starts the
replacements; every SIGKILL it sends is recorded (pid → when), because a run of a killed
worker ends then. ``FaultDriver`` picks faults with a seeded generator, each bounded in time,
and writes every step to the ``Timeline`` (printed as it goes, and in the failure report).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import sqlalchemy as sa

from jobs.execution.limits import EXIT_OVERRUN
from jobs.process.settings import load_settings
from jobs.store.models import JobRow
from tests.e2e.harness import Process, System
from tests.faults.chaos_webhooks import BadReceivers
from tests.faults.clock_skew import skew_env
from tests.faults.conftest import LEASE_TTL_S
from tests.faults.leader_lock import leader_pid
from tests.faults.report import Violation, clock_text
from tests.faults.servers import ThrowawayPostgres, ThrowawayRedis
from tests.slow_store import DELAY_ENV as STORE_DELAY_ENV
from workers.publisher import CeleryPublisher

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "expired"})
SKEW_S = 120.0
SKEW_FAULT = "skew-worker-clock"
WORKER_SLOTS = 2
# A worker stopped with SIGTERM finishes its running jobs (1.5 s at most) within this.
STOP_GRACE_S = 10.0
# A snapshot is restored only once the system has moved on from it.
SNAPSHOT_AGE_S = 5.0
SNAPSHOT_EVERY_S = 12.0
# Stalled batch uploads opened at once by the slow-bodies fault (one tenant's).
SLOW_UPLOADS = 12
# The run-time limit of a hung job (policy.timeout_grace_s is 1 s in the soak), and how long
# the fault waits for the worker running it to end; what the hung handler started has this
# long after that to be gone.
HUNG_TIMEOUT_S = 1.0
HUNG_WAIT_S = 30.0
CHILD_GONE_S = 5.0
# The slow blob store's fault: each write waits longer than a job's limit plus its grace
# (1 s + 1 s), of jobs whose handlers return at once a result too large to keep inline.
STORE_DELAY_S = 2.5
LARGE_JOBS = 3
LARGE_BYTES = 1024 * 1024 + 4096
LARGE_WAIT_S = 40.0
# Submits at once naming a name whose DNS never answers: more than a tenant's lookups.
SLOW_DNS_SUBMITS = 4
# The handlers of a worker that a rolling deploy reached with a build lacking the soak's own
# kinds (``tests.faults.handlers``).
PARTIAL_HANDLERS = "tests.handlers_for_tests:HANDLERS,tests.slow_store:HANDLERS"


@dataclass
class Timeline:
    """Timestamped lines: what the driver did and when, on the processes' log clock."""

    t0: float = field(default_factory=time.time)
    lines: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def log(self, text: str) -> None:
        now = time.time()
        line = f"t+{now - self.t0:6.1f}s {clock_text(now)} {text}"
        with self._lock:
            self.lines.append(line)
        sys.stderr.write(f"[chaos] {line}\n")

    def render(self) -> str:
        with self._lock:
            return "fault timeline:\n" + "\n".join(f"  {line}" for line in self.lines)


@dataclass
class Fleet:
    system: System
    timeline: Timeline
    workers: list[Process] = field(default_factory=list)
    dispatchers: list[Process] = field(default_factory=list)
    skews: dict[int, float] = field(default_factory=dict)  # pid → skew of skewed workers
    killed: dict[int, float] = field(default_factory=dict)  # pid → when it was SIGKILLed
    # pid → (SIGSTOP, SIGCONT) of each time the whole process was frozen past its leases
    frozen: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    stopped: set[int] = field(default_factory=set)  # pids stopped with SIGTERM
    pools: dict[int, str] = field(default_factory=dict)  # pid → the pool a worker joined
    _started: int = 0

    def start_worker(self, skew_s: float = 0.0, pool: str = "default",
                     handlers: str | None = None) -> Process:
        """``handlers``: its ``TIERQ_HANDLERS``, when it is not the system's."""
        self._started += 1
        name = f"worker-{self._started}" if pool == "default" else f"worker-{pool}-{self._started}"
        env = {**(skew_env(skew_s) if skew_s else {}),
               **({"TIERQ_HANDLERS": handlers} if handlers is not None else {})} or None
        process = self.system.start(name, "worker", "--concurrency", str(WORKER_SLOTS),
                                    "--pool", pool, env=env)
        self.workers.append(process)
        self.pools[process.popen.pid] = pool
        if skew_s:
            self.skews[process.popen.pid] = skew_s
        clock = f", clock {skew_s:+.0f} s" if skew_s else ""
        self.timeline.log(f"start {name} (pid {process.popen.pid}, pool {pool}{clock})")
        return process

    def replace_worker(self, process: Process) -> Process:
        """A worker in place of ``process``: its pool, its clock."""
        pid = process.popen.pid
        return self.start_worker(skew_s=self.skews.get(pid, 0.0),
                                 pool=self.pools.get(pid, "default"))

    def of_pool(self, pool: str) -> list[Process]:
        return [p for p in self.workers if self.pools.get(p.popen.pid, "default") == pool]

    def start_dispatcher(self) -> Process:
        self._started += 1
        process = self.system.start(f"dispatcher-{self._started}", "dispatcher")
        self.dispatchers.append(process)
        self.timeline.log(f"start {process.name} (pid {process.popen.pid})")
        return process

    def kill(self, process: Process) -> None:
        """SIGKILL the process's group and record when it was dead for sure."""
        process.kill()
        self.killed[process.popen.pid] = time.time()
        self.timeline.log(f"SIGKILL {process.name} (pid {process.popen.pid})")

    def stop(self, process: Process) -> None:
        """SIGTERM, as a deployment stops a worker; killed after ``STOP_GRACE_S``."""
        self.stopped.add(process.popen.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGTERM)
        try:
            process.popen.wait(STOP_GRACE_S)
            self.timeline.log(f"SIGTERM {process.name} (pid {process.popen.pid}): exited "
                              f"{process.popen.returncode}")
        except subprocess.TimeoutExpired:
            self.timeline.log(f"{process.name} did not stop in {STOP_GRACE_S:g} s")
            self.kill(process)

    def alive(self, processes: list[Process]) -> list[Process]:
        return [p for p in processes if p.popen.poll() is None]

    def died_unasked(self) -> list[str]:
        """Processes that exited though the driver neither killed nor stopped them (a
        worker that ended itself for a handler past its limit, as the contract says, aside)."""
        ours = set(self.killed) | self.stopped
        every = [*self.workers, *self.dispatchers, self.system.processes["api"]]
        return [f"{p.name} (pid {p.popen.pid}) exited {p.popen.returncode}" for p in every
                if p.popen.poll() is not None and p.popen.pid not in ours
                and not (p in self.workers and p.popen.returncode == EXIT_OVERRUN)]

    def heal(self, *, workers: dict[str, int], dispatchers: int) -> None:
        """Bring the fleet back to size, ``workers`` by pool (replacing processes that died
        by themselves)."""
        for _ in range(dispatchers - len(self.alive(self.dispatchers))):
            self.start_dispatcher()
        for pool, wanted in workers.items():
            for _ in range(wanted - len(self.alive(self.of_pool(pool)))):
                self.start_worker(pool=pool)


@dataclass
class FaultDriver:
    """Runs one fault at a time, at random intervals, until ``run`` has lasted its time."""

    fleet: Fleet
    redis_server: ThrowawayRedis
    pg: ThrowawayPostgres
    rng: random.Random
    only: set[str] | None = None  # the faults to choose from (None: all)
    snapshots: list[tuple[float, Path]] = field(default_factory=list)
    slow_key: str | None = None  # the API key of the tenant whose uploads stall
    hung_key: str | None = None  # the API key of the tenant whose jobs hang
    hung_jobs: list[str] = field(default_factory=list)  # each must end failed, timed_out
    hook_key: str | None = None  # the API key of the tenant whose webhooks try to harm
    receivers: BadReceivers | None = None
    hook_jobs: dict[str, str] = field(default_factory=dict)  # job → what its webhook does
    large_client: httpx.Client | None = None  # the tenant of the large results
    large_jobs: list[str] = field(default_factory=list)  # stored while the store was slow
    found: list[Violation] = field(default_factory=list)  # what a fault saw go wrong
    log: Callable[[str], None] = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.fleet.timeline.log

    @property
    def driven(self) -> list[str]:
        """The jobs the driver submitted itself (no load's)."""
        return [*self.hung_jobs, *self.hook_jobs, *self.large_jobs]

    def faults(self) -> dict[str, tuple[int, Callable[[], None]]]:
        """Each fault by name, with its weight once each has run once; ``only`` keeps some."""
        every = {
            "kill-worker": (3, self.kill_worker),
            "kill-dispatcher": (2, self.kill_dispatcher),
            "pause-postgres": (2, self.pause_postgres),
            "flush-redis": (1, self.flush_redis),
            "restart-redis-empty": (1, self.restart_redis_empty),
            "restore-redis-snapshot": (1, self.restore_snapshot),
            SKEW_FAULT: (1, self.skew_worker),
            "duplicate-messages": (2, self.duplicate_messages),
            "stall-leader": (2, self.stall_leader),
            "slow-bodies": (1, self.slow_bodies),
            "hung-handler": (1, self.hung_handler),
            "freeze-worker": (2, self.freeze_worker),
            "bad-webhooks": (1, self.bad_webhooks),
            "slow-blob-store": (1, self.slow_blob_store),
            "rolling-deploy": (1, self.rolling_deploy),
        }
        unknown = (self.only or set()) - set(every)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(every)}")
        return {name: f for name, f in every.items() if self.only is None or name in self.only}

    def run(self, seconds: float) -> None:
        """Every fault once in a random order (the clock skew twice: the second swaps a
        skewed worker for one skewed the other way, so both directions are met), then random
        ones, until ``seconds`` pass."""
        faults = self.faults()
        order = [*faults, *([SKEW_FAULT] if SKEW_FAULT in faults else [])]
        self.rng.shuffle(order)
        end = time.monotonic() + seconds
        self.take_snapshot()
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(2.0, 5.0))
            if self.snapshots[-1][0] < time.time() - SNAPSHOT_EVERY_S:
                self.take_snapshot()
            name = order.pop(0) if order else self.rng.choices(
                list(faults), weights=[w for w, _ in faults.values()])[0]
            self.log(f"fault: {name}")
            faults[name][1]()

    # -- the faults ----------------------------------------------------------------------

    def kill_worker(self) -> None:
        alive = self.fleet.alive(self.fleet.workers)
        if not alive:
            self.log("no worker alive to kill")
            self.fleet.start_worker()
            return
        victim = self.rng.choice(alive)
        self.fleet.kill(victim)
        time.sleep(self.rng.uniform(0, 2))
        self.fleet.replace_worker(victim)

    def kill_dispatcher(self) -> None:
        alive = self.fleet.alive(self.fleet.dispatchers)
        leader = self.leader_pid()
        victim = next((p for p in alive if p.popen.pid == leader), None)
        if not alive:
            self.log("no dispatcher alive to kill")
            self.fleet.start_dispatcher()
            return
        if victim is None:
            victim = self.rng.choice(alive)
            self.log(f"leader unknown (lock holder pid {leader}): a dispatcher at random")
        self.fleet.kill(victim)
        time.sleep(self.rng.uniform(0.5, 3))
        self.fleet.start_dispatcher()

    def pause_postgres(self) -> None:
        seconds = self.rng.uniform(2, 5)
        self.pg.pause()
        self.log(f"postgres paused (SIGSTOP) for {seconds:.1f} s")
        try:
            time.sleep(seconds)
        finally:
            self.pg.resume()
            self.log("postgres resumed (SIGCONT)")

    def flush_redis(self) -> None:
        # FLUSHALL, not the index's keys alone: the throwaway server is this test's, and a
        # real loss of Redis loses the broker's queues (same server, same prefix) with it.
        self.redis_server.flushall()
        self.log("redis: FLUSHALL (index, leases, lock, broker queues)")

    def restart_redis_empty(self) -> None:
        self.redis_server.kill()
        down = self.rng.uniform(1, 3)
        self.log(f"redis killed; restarting empty in {down:.1f} s")
        time.sleep(down)
        self.redis_server.start()
        self.log("redis up, empty")

    def restore_snapshot(self) -> None:
        old = [(at, path) for at, path in self.snapshots if at < time.time() - SNAPSHOT_AGE_S]
        if not old:
            self.log("no snapshot old enough: flush instead")
            self.flush_redis()
            return
        at, path = self.rng.choice(old)
        self.redis_server.restore(path)
        self.log(f"redis restarted from the snapshot of {clock_text(at)} ({path.name})")

    def skew_worker(self) -> None:
        """Replace a worker of the default pool with one whose clock is ``SKEW_S`` off (one
        skewed at a time)."""
        alive = self.fleet.alive(self.fleet.of_pool("default"))
        skewed = [p for p in alive if p.popen.pid in self.fleet.skews]
        sign = -self.fleet.skews[skewed[0].popen.pid] / SKEW_S if skewed else \
            self.rng.choice((1, -1))
        self.fleet.start_worker(skew_s=sign * SKEW_S)
        if skewed or alive:
            self.fleet.stop(skewed[0] if skewed else self.rng.choice(alive))

    def duplicate_messages(self) -> None:
        """For a few seconds, a second copy of every message the dispatcher publishes (as a
        broker that delivers at least once may hand out): each dispatched attempt is sent
        again to its tier's queue, as its task, by a publisher of the test's own."""
        seconds = self.rng.uniform(2, 5)
        copied = duplicate_in_flight(self.fleet.system.env, seconds)
        self.log(f"duplicated {copied} broker messages over {seconds:.1f} s")

    def stall_leader(self) -> None:
        """SIGSTOP the leading dispatcher, inside an SQL transaction when it can be caught
        in one (up to 3 s of looking), for a few leader TTLs; then SIGCONT. A standby must
        lead meanwhile, and the stalled one step down without harm when it wakes."""
        leader = self.leader_pid()
        victim = next((p for p in self.fleet.alive(self.fleet.dispatchers)
                       if p.popen.pid == leader), None)
        if victim is None:
            self.log(f"leader unknown (lock holder pid {leader}): no stall")
            return
        inside = wait_inside_transaction(self.fleet.system.env["TIERQ_DATABASE_URL"],
                                         victim.popen.pid, within_s=3.0)
        seconds = self.rng.uniform(4, 9)
        os.killpg(victim.popen.pid, signal.SIGSTOP)
        where = "inside a transaction" if inside else "between transactions"
        self.log(f"SIGSTOP leader {victim.name} (pid {victim.popen.pid}) {where} "
                 f"for {seconds:.1f} s")
        try:
            time.sleep(seconds)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(victim.popen.pid, signal.SIGCONT)
            self.log(f"SIGCONT {victim.name}")

    def slow_bodies(self) -> None:
        """Batch uploads that send a line and stall (more than any one tenant may hold),
        held a few seconds and abandoned: other tenants' submits go on, and nothing of
        an abandoned upload is stored."""
        system = self.fleet.system
        if self.slow_key is None:
            client = system.tenant("slow-uploader", "free")
            self.slow_key = client.headers["Authorization"].removeprefix("Bearer ")
        seconds = self.rng.uniform(2, 6)
        opened = stall_uploads(system.url, self.slow_key, count=SLOW_UPLOADS, hold_s=seconds)
        self.log(f"{opened} batch uploads stalled for {seconds:.1f} s, then abandoned")

    def hung_handler(self) -> None:
        """A job whose handler starts a child process (as a CUDA binary) and ignores every
        stop, limited to ``HUNG_TIMEOUT_S``: the worker running it records it timed out at
        its limit plus the grace, lets its other jobs finish (or hands them back) and exits
        for a new one to take its place, and the child ends with it."""
        system = self.fleet.system
        if self.hung_key is None:
            client = system.tenant("hung-jobs", "premium")
            self.hung_key = client.headers["Authorization"].removeprefix("Bearer ")
        headers = {"Authorization": f"Bearer {self.hung_key}"}
        alive = {p.popen.pid for p in self.fleet.alive(self.fleet.workers)}
        child_pid_file = system.workdir / f"hung-child-{len(self.hung_jobs)}.pid"
        try:
            answer = httpx.post(f"{system.url}/v1/jobs", headers=headers, timeout=10, json={
                "kind": "hung", "timeout_s": HUNG_TIMEOUT_S,
                "payload": {"child_pid_file": str(child_pid_file)}})
        except httpx.HTTPError as exc:
            self.log(f"hung job not submitted: {exc!r}")
            return
        if answer.status_code != 202:
            self.log(f"hung job not submitted: {answer.status_code} {answer.text[:200]}")
            return
        job_id = answer.json()["id"]
        self.hung_jobs.append(job_id)
        self.log(f"submitted hung job {job_id} (timeout_s {HUNG_TIMEOUT_S:g})")
        end = time.monotonic() + HUNG_WAIT_S
        while time.monotonic() < end:
            ended = [p for p in self.fleet.workers if p.popen.pid in alive
                     and p.popen.poll() == EXIT_OVERRUN]
            if ended:
                for process in ended:
                    self.log(f"{process.name} (pid {process.popen.pid}) ended itself for the "
                             f"hung job (exit {EXIT_OVERRUN})")
                    self.fleet.replace_worker(process)
                self.found += child_ended(job_id, child_pid_file, self.log)
                return
            time.sleep(0.2)
        self.log(f"no worker ended for hung job {job_id} within {HUNG_WAIT_S:g} s")

    def bad_webhooks(self) -> None:
        """Jobs whose webhooks name a receiver that hangs, one whose answer never ends, one
        whose answer is 48 MiB, a name whose DNS never answers (several submits at once, more
        than the tenant's lookups) and a name that turns to loopback after the API's check
        (``tests.faults.chaos_webhooks``)."""
        system = self.fleet.system
        if self.hook_key is None:
            client = system.tenant("hooks", "standard")
            self.hook_key = client.headers["Authorization"].removeprefix("Bearer ")
            self.receivers = BadReceivers()
        assert self.receivers is not None
        n = len(self.hook_jobs)
        urls = self.receivers.urls(n)
        asked = [(what, url) for what, url in urls.items() if what != "slow-dns"]
        asked += [("slow-dns", urls["slow-dns"].replace(f"hook-{n}", f"hook-{n}-{i}"))
                  for i in range(SLOW_DNS_SUBMITS)]
        answers: list[str] = []

        def submit(what: str, url: str) -> None:
            began = time.monotonic()
            try:
                answer = httpx.post(f"{system.url}/v1/jobs", timeout=15, json={
                    "kind": "echo", "payload": {"hook": what}, "webhook": {"url": url}},
                    headers={"Authorization": f"Bearer {self.hook_key}"})
            except httpx.HTTPError as exc:
                answers.append(f"{what}: {exc!r}")
                return
            took = time.monotonic() - began
            answers.append(f"{what}: {answer.status_code} in {took:.1f} s")
            if answer.status_code == 202:
                self.hook_jobs[answer.json()["id"]] = what

        threads = [threading.Thread(target=submit, args=pair) for pair in asked]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.log(f"bad webhooks submitted: {'; '.join(sorted(answers))}")

    def slow_blob_store(self) -> None:
        """For a while each write to the blob store takes longer than a job's run-time limit
        plus its grace; jobs whose handlers return at once a result too large for their row
        (``large.result``, limit ``HUNG_TIMEOUT_S``) must keep it: succeeded, one start, the
        result whole, and no worker ended for an overrun."""
        system = self.fleet.system
        delay_file = Path(system.env[STORE_DELAY_ENV])
        alive = {p.popen.pid for p in self.fleet.alive(self.fleet.workers)}
        if self.large_client is None:
            self.large_client = system.tenant("large-results", "premium")
        client = self.large_client
        submitted: list[str] = []
        delay_file.write_text(str(STORE_DELAY_S))
        self.log(f"blob store writes slowed to {STORE_DELAY_S:g} s")
        try:
            for _ in range(LARGE_JOBS):
                try:
                    answer = client.post("/v1/jobs", json={
                        "kind": "large.result", "payload": {"bytes": LARGE_BYTES},
                        "timeout_s": HUNG_TIMEOUT_S})
                except httpx.HTTPError as exc:
                    self.log(f"large job not submitted: {exc!r}")
                    continue
                if answer.status_code == 202:
                    submitted.append(answer.json()["id"])
                else:
                    self.log(f"large job not submitted: {answer.status_code}")
            self.large_jobs += submitted
            ended = wait_ended(client, submitted, LARGE_WAIT_S)
        finally:
            delay_file.write_text("0")
            self.log("blob store writes fast again")
        overran = [p for p in self.fleet.workers if p.popen.pid in alive
                   and p.popen.poll() == EXIT_OVERRUN]
        for process in overran:
            self.fleet.replace_worker(process)
        self.found += large_results_kept(client, ended, submitted, overran)
        self.log(f"large results: {', '.join(f'{j[:8]} {s}' for j, s in ended.items())}")

    def rolling_deploy(self) -> None:
        """A worker of the default pool whose build lacks the soak's own kinds (``tracked``,
        ``hung``, ...), as the first host a rolling deploy reaches, or one without the module:
        it serves beside the others for a few seconds, then is stopped (SIGTERM). No job of
        a kind it lacks may fail for it or be charged a start: such a job goes only to a
        worker that runs its kind, or back to its place uncharged."""
        process = self.fleet.start_worker(handlers=PARTIAL_HANDLERS)
        seconds = self.rng.uniform(5, 10)
        self.log(f"{process.name} lacks the soak's kinds; serving {seconds:.1f} s")
        time.sleep(seconds)
        self.fleet.stop(process)

    def freeze_worker(self) -> None:
        """SIGSTOP a worker whole (its process group) past its leases' TTL, as a machine
        that hangs; then SIGCONT. Its leases lapse and the reaper gives its jobs back (or
        fails those out of starts); woken, it finds its leases lost and records nothing."""
        alive = self.fleet.alive(self.fleet.workers)
        if not alive:
            self.log("no worker alive to freeze")
            return
        victim = self.rng.choice(alive)
        seconds = self.rng.uniform(2.5, 4.0) * LEASE_TTL_S
        stopped_at = time.time()
        os.killpg(victim.popen.pid, signal.SIGSTOP)
        self.log(f"SIGSTOP {victim.name} (pid {victim.popen.pid}) for {seconds:.1f} s")
        try:
            time.sleep(seconds)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(victim.popen.pid, signal.SIGCONT)
            self.fleet.frozen.setdefault(victim.popen.pid, []).append((stopped_at, time.time()))
            self.log(f"SIGCONT {victim.name}")

    def close(self) -> None:
        """Stop the receivers the faults started; what hangs on them gives up."""
        if self.receivers is not None:
            self.receivers.close()
        if self.large_client is not None:
            self.large_client.close()

    def take_snapshot(self) -> None:
        path = self.redis_server.snapshot()
        self.snapshots.append((time.time(), path))
        self.log(f"redis SAVE → {path.name}")

    def leader_pid(self) -> int | None:
        """The pid of the leading dispatcher, from the leader lock's token."""
        return leader_pid(self.redis_server, self.fleet.system.env["TIERQ_KEY_PREFIX"])

# -- helpers of the faults ------------------------------------------------------------------


def child_ended(job_id: str, pid_file: Path, log: Callable[[str], None]) -> list[Violation]:
    """The child the hung handler of ``job_id`` started is gone within ``CHILD_GONE_S`` (or
    was never started: the job did not run)."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        log(f"hung job {job_id}: no child recorded")
        return []
    end = time.monotonic() + CHILD_GONE_S
    while time.monotonic() < end:
        try:
            child = psutil.Process(pid)
            if child.status() == psutil.STATUS_ZOMBIE or child.name() != "sleep":
                break
        except psutil.Error:
            break
        time.sleep(0.1)
    else:
        return [Violation(invariant="a hung handler's child ends with it",
                          detail=f"{job_id}: its child (pid {pid}) still runs "
                                 f"{CHILD_GONE_S:g} s after its worker ended",
                          job_ids=(job_id,))]
    log(f"hung job {job_id}: its child (pid {pid}) ended with it")
    return []


def wait_ended(client: httpx.Client, job_ids: list[str], within_s: float) -> dict[str, str]:
    """Each job's status once all have ended, or as they are at ``within_s``."""
    end = time.monotonic() + within_s
    statuses: dict[str, str] = {}
    while True:
        for job_id in job_ids:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                statuses[job_id] = client.get(f"/v1/jobs/{job_id}").json()["status"]
        if all(statuses.get(j) in TERMINAL for j in job_ids) or time.monotonic() > end:
            return statuses
        time.sleep(0.5)


def large_results_kept(client: httpx.Client, statuses: dict[str, str], job_ids: list[str],
                       overran: list[Process]) -> list[Violation]:
    """Each large job succeeded at its first start with its whole result; no worker ended
    for an overrun while they ran."""
    found = [Violation(invariant="a result made in time is kept",
                       detail=f"{p.name} (pid {p.popen.pid}) ended for an overrun while the "
                              "blob store was slow") for p in overran]
    for job_id in job_ids:
        body: dict[str, object] = {}
        with contextlib.suppress(httpx.HTTPError, ValueError):
            body = client.get(f"/v1/jobs/{job_id}").json()
        result: object = None
        if body.get("status") == "succeeded":
            with contextlib.suppress(httpx.HTTPError, ValueError):
                answer = client.get(f"/v1/jobs/{job_id}/result").json()
                # In the blob store (its own URL), or in the row had the store not answered.
                result = (client.get(answer["result_url"]).json() if answer.get("result_url")
                          else answer.get("result"))
        whole = (isinstance(result, dict) and result.get("job") == job_id
                 and len(str(result.get("text", ""))) == LARGE_BYTES)
        if body.get("status") != "succeeded" or body.get("attempt") != 1 or not whole:
            found.append(Violation(
                invariant="a result made in time is kept",
                detail=f"{job_id}: {statuses.get(job_id)}, attempt {body.get('attempt')}, "
                       f"error {body.get('error')!r}, result whole: {whole}",
                job_ids=(job_id,)))
    return found



def duplicate_in_flight(env: dict[str, str], seconds: float) -> int:
    """Publish a second message for every attempt that SQL shows dispatched, for
    ``seconds``; the number of copies sent."""
    settings = load_settings(database_url=env["TIERQ_DATABASE_URL"],
                             redis_url=env["TIERQ_REDIS_URL"], key_prefix=env["TIERQ_KEY_PREFIX"])
    publisher = CeleryPublisher(settings)
    engine = sa.create_engine(env["TIERQ_DATABASE_URL"], poolclass=sa.NullPool)
    sent: set[tuple[str, int]] = set()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            try:
                with engine.connect() as conn:
                    rows = conn.execute(sa.select(JobRow.id, JobRow.attempt, JobRow.tier)
                                        .where(JobRow.status == "dispatched")).all()
            except sa.exc.OperationalError:
                rows = []  # PostgreSQL paused or restarting: try again
            for job_id, attempt, tier in rows:
                if (job_id, attempt) not in sent:
                    with contextlib.suppress(Exception):  # a broker down: no copy, as lost
                        publisher.publish(job_id, attempt, tier)
                        sent.add((job_id, attempt))
            time.sleep(0.02)
    finally:
        publisher.close()
        engine.dispose()
    return len(sent)


def wait_inside_transaction(database_url: str, pid: int, *, within_s: float) -> bool:
    """Wait until a PostgreSQL session of process ``pid`` (or its children) is inside a
    transaction; False if none was seen within ``within_s``."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    end = time.monotonic() + within_s
    try:
        while time.monotonic() < end:
            ports = set()
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    ports |= {c.laddr.port for c in proc.net_connections(kind="tcp")
                              if c.laddr}
            try:
                with engine.connect() as conn:
                    busy = conn.execute(sa.text(
                        "SELECT client_port FROM pg_stat_activity "
                        "WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()")).scalars()
                    if ports & set(busy):
                        return True
            except sa.exc.OperationalError:
                return False
            time.sleep(0.005)
    finally:
        engine.dispose()
    return False


def stall_uploads(url: str, api_key: str, *, count: int, hold_s: float) -> int:
    """Open ``count`` NDJSON batch uploads that send their headers and half a line, hold
    them ``hold_s``, then drop the connections; how many were opened."""
    parsed = urlsplit(url)
    head = (f"POST /v1/batches?kind=tracked HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
            f"Authorization: Bearer {api_key}\r\nContent-Type: application/x-ndjson\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    part = b'{"seconds": 0.1}\n{"seco'
    chunk = f"{len(part):x}\r\n".encode() + part + b"\r\n"
    sockets = []
    try:
        for _ in range(count):
            with contextlib.suppress(OSError):
                sock = socket.create_connection((parsed.hostname, parsed.port), timeout=5)
                sockets.append(sock)
                sock.sendall(head.encode() + chunk)
        time.sleep(hold_s)
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
    return len(sockets)
