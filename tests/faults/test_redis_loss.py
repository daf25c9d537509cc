"""Redis loses its data under a steady submit load: flushed, or restarted empty.

The index, the leases, the lock and the broker's queues are gone at once. The leading
dispatcher notices (its lock and the index's generation sentinel are gone), rebuilds the
index from SQL before it dispatches again (leases of running jobs first, so no cap is
exceeded), and every job that got a 202 finishes, once. While Redis restarts, clients see
503s; until the workers have registered again the pool looks empty and some submits are
refused with 429 ``capacity``; never a 500, never a hung request.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import System, wait_until
from tests.faults.checks import check_invariants
from tests.faults.conftest import SystemFactory
from tests.faults.load import Answer, SubmitLoad, assert_clean_answers, probe_ready
from tests.faults.servers import ThrowawayRedis

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]

# Two workers of two slots: a standard tenant may run floor(4 × 0.5) = 2 jobs at once.
CONFIG = """
[tiers.standard]
base_priority = 10
max_wait_s = 300
tenant_share = 0.5
"""


def start(fault_system: SystemFactory) -> tuple[System, list[httpx.Client]]:
    system = fault_system(CONFIG)
    system.env["TIERQ_POLICY__LEADER_TTL_S"] = "2"
    system.start_api()
    system.start("dispatcher-1", "dispatcher")
    system.start("dispatcher-2", "dispatcher")
    for n in (1, 2):
        system.start(f"worker-{n}", "worker", "--concurrency", "2")
    tenants = [system.tenant(name, "standard") for name in ("acme", "globex")]
    system.wait_for_capacity(tenants[0], 4)
    submitters = [httpx.Client(base_url=system.url, headers=t.headers) for t in tenants]
    system.clients.extend(submitters)
    return system, submitters


def refused(answer: Answer) -> bool:
    """A 429 ``capacity`` with ``Retry-After``: nothing accepted, the client told when."""
    capacity = (answer.status, answer.error_type) == (429, "capacity")
    return capacity and answer.retry_after is not None


def run_through(
    fault_system: SystemFactory, run_log: Path, lose: Callable[[System, SubmitLoad], None]
) -> SubmitLoad:
    """Submit steadily, ``lose`` Redis's data midway, keep submitting; check the invariants."""
    system, submitters = start(fault_system)
    with SubmitLoad(clients=submitters, payload={"seconds": 0.3}, period_s=0.05,
                    max_jobs=250) as load:
        wait_until(lambda: len(load.accepted) >= 30, timeout=30)
        lose(system, load)
        after = len(load.accepted)
        wait_until(lambda: len(load.accepted) >= after + 30, timeout=60)

    assert_clean_answers([answer for answer in load.answers if not refused(answer)])
    jobs = check_invariants(
        system.env["TIERQ_DATABASE_URL"], load.accepted, tier_caps={"standard": 2},
        run_log=run_log, timeout=120,
    )
    assert {job.status.value for job in jobs.values()} == {"succeeded"}
    rebuilds = sum(
        process.log.read_text(errors="replace").count("index.rebuilt")
        for process in system.processes.values() if process.name.startswith("dispatcher")
    )
    assert rebuilds >= 2, "the index was not rebuilt after the loss"
    return load


def test_a_flushed_redis_is_rebuilt_and_no_job_is_lost(
    fault_system: SystemFactory, fault_redis: ThrowawayRedis, run_log: Path
) -> None:
    run_through(fault_system, run_log, lambda _system, _load: fault_redis.flushall())


def test_a_redis_restarted_empty_is_rebuilt_and_no_job_is_lost(
    fault_system: SystemFactory, fault_redis: ThrowawayRedis, run_log: Path
) -> None:
    def restart_empty(system: System, load: SubmitLoad) -> None:
        fault_redis.stop()  # not persistent: it comes back with nothing
        wait_until(lambda: probe_ready(system.url) == 503, timeout=30)
        # Down until the steady load has met the outage, however fast this machine is.
        wait_until(lambda: any(a.status == 503 for a in load.answers), timeout=30)
        fault_redis.start()
        wait_until(lambda: probe_ready(system.url) == 200, timeout=30)

    load = run_through(fault_system, run_log, restart_empty)
    assert any(answer.status == 503 for answer in load.answers), "no request met the outage"
