"""Hosts whose clocks disagree by minutes change nothing: Redis's clock decides.

A worker runs 120 s behind and the API 180 s ahead (their ``time.time()`` is shifted by
``tests/faults/skew/sitecustomize.py``, put first on their ``PYTHONPATH``); the dispatcher
and Redis keep true time. With a 2 s lease, a worker that wrote its lease expiry with its own
clock would see every lease reaped at once and every job run twice; an API that stamped order
keys with its own clock would age its jobs three minutes wrong.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jobs.process.settings import load_settings
from tests.e2e.harness import System, wait_terminal
from tests.faults.checks import check_invariants
from tests.faults.clock_skew import skew_env
from tests.faults.conftest import SystemFactory
from tests.faults.handlers import read_runs
from tests.faults.servers import ThrowawayRedis

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

WORKER_SKEW_S = -120.0
API_SKEW_S = 180.0


@contextmanager
def skewed(system: System, skew_s: float) -> Iterator[None]:
    """Processes started inside see their wall clock shifted by ``skew_s``."""
    saved = dict(system.env)
    system.env.update(skew_env(skew_s))
    try:
        yield
    finally:
        system.env.clear()
        system.env.update(saved)


def test_skewed_hosts_lose_no_lease_run_nothing_twice_and_age_exactly(
    fault_system: SystemFactory, fault_redis: ThrowawayRedis, run_log: Path
) -> None:
    system = fault_system()
    with skewed(system, API_SKEW_S):
        system.start_api()
    system.start("dispatcher", "dispatcher")
    with skewed(system, WORKER_SKEW_S):
        system.start("worker", "worker", "--concurrency", "2")
    client = system.tenant("acme", "premium")
    system.wait_for_capacity(client, 2)

    submitted_at = time.time()  # this process keeps true time
    accepted = []
    for _ in range(4):  # each runs three lease TTLs: several renewals from the skewed host
        response = client.post("/v1/jobs", json={"kind": "tracked", "payload": {"seconds": 6}})
        assert response.status_code == 202, response.text
        accepted.append(response.json())
    for job in accepted:
        assert wait_terminal(client, job["id"], timeout=120)["status"] == "succeeded"

    jobs = check_invariants(system.env["TIERQ_DATABASE_URL"], [j["id"] for j in accepted],
                            tier_caps={"premium": 2}, run_log=run_log)
    runs = read_runs(run_log)
    policy = load_settings().build_policy()
    tier = policy.tiers["premium"]
    for job in jobs.values():
        assert job.attempt == 1 and job.starts == 1  # no lease reaped early
        assert [run.what for run in runs[job.id]] == ["start", "done"]  # run once
        # The API's skewed clock wrote nothing: the job was enqueued when Redis says.
        assert abs(job.enqueued_at - submitted_at) < 30
        assert job.order_key == pytest.approx(
            job.enqueued_at + tier.base_priority * policy.ageing_rate_s, abs=1e-6
        )
