"""kill -9 a worker in the middle of a job: the lease brings the job back, nothing runs twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.index.counters import read_reclaimed
from jobs.index.redis_index import RedisIndex
from tests.e2e.harness import wait_terminal, wait_until
from tests.faults.checks import check_invariants
from tests.faults.conftest import LEASE_TTL_S, SystemFactory
from tests.faults.handlers import Run, read_runs
from tests.faults.servers import ThrowawayRedis

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

# Two workers of one slot each: a standard tenant's cap is floor(2 × 0.5) = 1, so the job's
# second attempt can only start once the first one's slot has come back.
CONFIG = """
[tiers.standard]
base_priority = 10
max_wait_s = 120
tenant_share = 0.5
"""
# The reaper looks every second; leave room for a loaded machine.
RECOVERY_TIMEOUT_S = 3 * LEASE_TTL_S + 10


def test_a_killed_workers_job_succeeds_on_attempt_2_and_its_slot_comes_back(
    fault_system: SystemFactory, fault_redis: ThrowawayRedis, run_log: Path
) -> None:
    system = fault_system(CONFIG)
    system.start_api()
    system.start("dispatcher", "dispatcher")
    workers = [system.start(f"worker-{n}", "worker", "--concurrency", "1") for n in (1, 2)]
    client = system.tenant("acme", "standard")
    system.wait_for_capacity(client, 2)

    accepted = []
    for seconds in (3, 0.1):  # the victim, then a job of the same tenant queued behind it
        response = client.post(
            "/v1/jobs", json={"kind": "tracked", "payload": {"seconds": seconds}}
        )
        assert response.status_code == 202, response.text
        accepted.append(response.json()["id"])
    victim_id = accepted[0]

    first = wait_until(lambda: _runs_of(run_log, victim_id, "start"))[0]
    assert first.attempt == 1
    victim = next(w for w in workers if w.popen.pid == first.pid)
    victim.kill()  # SIGKILL to its whole process group

    second = wait_until(
        lambda: [r for r in _runs_of(run_log, victim_id, "start") if r.attempt == 2],
        timeout=RECOVERY_TIMEOUT_S,
    )[0]
    assert second.pid != first.pid
    final = wait_terminal(client, victim_id)
    assert (final["status"], final["attempt"]) == ("succeeded", 2)
    assert client.get(f"/v1/jobs/{victim_id}/result").json()["result"]["attempt"] == 2

    jobs = check_invariants(
        system.env["TIERQ_DATABASE_URL"], accepted, tier_caps={"standard": 1}, run_log=run_log
    )
    assert {job.status.value for job in jobs.values()} == {"succeeded"}
    # Nothing is left holding a slot: the pool and the tenant are back to zero in flight.
    tenant_id = jobs[victim_id].tenant_id
    index = RedisIndex(fault_redis.client(), system.env["TIERQ_KEY_PREFIX"])
    wait_until(lambda: client.get("/v1/queues").json()["pool"]["inflight"] == 0,
               timeout=RECOVERY_TIMEOUT_S)
    assert index.tenant_inflight(tenant_id) == 0
    # The reaper counted the reclaimed lease, fleet-wide; /metrics shows the count.
    reclaimed = read_reclaimed(fault_redis.client(), system.env["TIERQ_KEY_PREFIX"])
    assert reclaimed >= 1
    reclaimed_line = f'tierq_leases_reclaimed_total{{pool="default"}} {float(reclaimed)}'
    assert reclaimed_line in client.get("/metrics").text


def _runs_of(run_log: Path, job_id: str, what: str) -> list[Run]:
    return [run for run in read_runs(run_log).get(job_id, []) if run.what == what]
