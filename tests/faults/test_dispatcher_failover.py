"""Two dispatchers: kill -9 the leader under load, and a standby takes over; stop it cleanly,
and it hands over at once.

Whoever leads, no job attempt is dispatched twice: both dispatchers' ``jobs.dispatched`` log
lines and the ``tracked`` handler's trace of started runs name each (job, attempt) once.
Afterwards every accepted job has finished, once, and no tenant ran more than its cap.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import Process, System, wait_until
from tests.faults.checks import check_invariants
from tests.faults.conftest import SystemFactory
from tests.faults.handlers import read_runs
from tests.faults.leader_lock import leader_pid
from tests.faults.load import SubmitLoad, assert_clean_answers
from tests.faults.servers import ThrowawayRedis

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]

LEADER_TTL_S = 2.0
# A standby tries the lock every third of its TTL: it leads within 4/3 of the TTL after
# the lock lapses; the rest is room for a loaded machine.
TAKEOVER_TIMEOUT_S = 2 * LEADER_TTL_S + 8
# Two workers of two slots: a standard tenant may run floor(4 × 0.5) = 2 jobs at once.
CONFIG = """
[tiers.standard]
base_priority = 10
max_wait_s = 300
tenant_share = 0.5
"""
# A jobs.dispatched line, JSON (as the processes log into files) or text.
DISPATCHED = re.compile(r'jobs\.dispatched.*?jobs(?:=|": ")([^\s"]+)')


def start_system(fault_system: SystemFactory, leader_ttl_s: float) -> System:
    system = fault_system(CONFIG)
    system.env["TIERQ_POLICY__LEADER_TTL_S"] = str(leader_ttl_s)
    system.start_api()
    for n in (1, 2):
        system.start(f"worker-{n}", "worker", "--concurrency", "2")
    return system


def start_dispatchers(
    system: System, redis_server: ThrowawayRedis
) -> tuple[Process, Process]:
    """Start two dispatchers, the first leading before the second starts."""
    prefix = system.env["TIERQ_KEY_PREFIX"]
    first = system.start("dispatcher-1", "dispatcher")
    wait_until(lambda: leader_pid(redis_server, prefix) == first.popen.pid)
    second = system.start("dispatcher-2", "dispatcher")
    wait_until(lambda: "dispatcher.standby" in second.log.read_text(errors="replace"))
    return first, second


def clients(system: System) -> list[httpx.Client]:
    tenants = [system.tenant(name, "standard") for name in ("acme", "globex")]
    system.wait_for_capacity(tenants[0], 4)
    submitters = [httpx.Client(base_url=system.url, headers=t.headers) for t in tenants]
    system.clients.extend(submitters)
    return submitters


def dispatched_twice(system: System, run_log: Path) -> list[tuple[str, int]]:
    """(job, attempt) pairs dispatched, or started, more than once. (A job may reach its
    slot without a dispatcher round: a submit offers it to a free slot, a slot that frees
    takes it; so some rounds, or none, log a dispatch.)"""
    logged: Counter[tuple[str, int]] = Counter()
    for process in system.processes.values():
        if process.name.startswith("dispatcher"):
            for match in DISPATCHED.finditer(process.log.read_text(errors="replace")):
                for pair in match[1].split(","):  # job_id:attempt, one pair per job
                    job_id, attempt = pair.rsplit(":", 1)
                    logged[(job_id, int(attempt))] += 1
    started: Counter[tuple[str, int]] = Counter(
        (run.job_id, run.attempt)
        for runs in read_runs(run_log).values() for run in runs if run.what == "start"
    )
    assert started, "no job was started"
    return sorted({key for counts in (logged, started) for key, n in counts.items() if n > 1})


def hand_over_under_load(
    system: System,
    fault_redis: ThrowawayRedis,
    run_log: Path,
    depose: Callable[[Process], None],
    takeover_timeout_s: float,
) -> tuple[Process, Process]:
    """Two dispatchers under steady load; ``depose`` the leader; the standby must lead within
    ``takeover_timeout_s`` and no accepted job may be lost or dispatched twice."""
    prefix = system.env["TIERQ_KEY_PREFIX"]
    first, second = start_dispatchers(system, fault_redis)
    with SubmitLoad(clients=clients(system), payload={"seconds": 0.2}, period_s=0.05,
                    max_jobs=200) as load:
        wait_until(lambda: len(load.accepted) >= 20, timeout=30)
        depose(first)
        wait_until(lambda: leader_pid(fault_redis, prefix) == second.popen.pid,
                   timeout=takeover_timeout_s)
        after = len(load.accepted)
        wait_until(lambda: len(load.accepted) >= after + 20, timeout=30)

    assert_clean_answers(load.answers)
    jobs = check_invariants(
        system.env["TIERQ_DATABASE_URL"], load.accepted, tier_caps={"standard": 2},
        run_log=run_log,
    )
    assert {job.status.value for job in jobs.values()} == {"succeeded"}
    assert dispatched_twice(system, run_log) == []
    return first, second


def test_a_standby_takes_over_when_the_leader_is_killed(
    fault_system: SystemFactory, fault_redis: ThrowawayRedis, run_log: Path
) -> None:
    system = start_system(fault_system, LEADER_TTL_S)
    # SIGKILL to its process group, mid-flight
    _, second = hand_over_under_load(
        system, fault_redis, run_log, Process.kill, TAKEOVER_TIMEOUT_S
    )
    assert "dispatcher.leading" in second.log.read_text(errors="replace")


def test_a_leader_stopped_cleanly_hands_over_without_waiting_out_its_lock(
    fault_system: SystemFactory, fault_redis: ThrowawayRedis, run_log: Path
) -> None:
    # A lock far longer than the wait below: only a resign can hand it over in time.
    long_ttl_s = 120.0
    system = start_system(fault_system, long_ttl_s)

    def stop_cleanly(leader: Process) -> None:
        leader.stop()  # SIGTERM: finish the round, resign, exit
        assert leader.popen.returncode == 0

    first, _ = hand_over_under_load(system, fault_redis, run_log, stop_cleanly, long_ttl_s / 4)
    assert "dispatcher.resigned" in first.log.read_text(errors="replace")
