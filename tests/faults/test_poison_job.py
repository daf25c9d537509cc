"""A job that kills its worker every time ends ``failed`` after max_attempts: no crash loop.

The test plays the process supervisor with ``tierq up``'s own (``jobs.local.supervisor``): the
worker is restarted each time the poison job kills it, and other work keeps flowing.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from jobs.local.supervisor import Backoff, ChildSpec, Supervisor
from tests.e2e.harness import wait_terminal
from tests.faults.checks import check_invariants
from tests.faults.conftest import SystemFactory

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

MAX_ATTEMPTS = 3
# A crash also takes down whatever else the worker held or was about to start, and a message
# sent to a dead worker waits out its lease: bystanders get attempts to spare.
BYSTANDER_ATTEMPTS = 10
# More restarts than the poison job has attempts means it is crash-looping.
MAX_RESTARTS = MAX_ATTEMPTS + 2

# One worker slot; every tier's tenants may use it.
CONFIG = """
[tiers.standard]
base_priority = 10
max_wait_s = 300
tenant_share = 1.0
"""


class WorkerSupervisor:
    """Restarts the worker whenever it dies, at most ``MAX_RESTARTS`` times."""

    def __init__(self, env: dict[str, str]) -> None:
        self.supervisor = Supervisor(backoff=Backoff(initial_s=0.2, max_s=1.0), grace_s=10)
        self.supervisor.add(
            ChildSpec(
                name="worker",
                argv=[sys.executable, "-m", "jobs.cli", "worker", "--concurrency", "1"],
                env=env,
            )
        )
        self.exits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="supervisor")

    def __enter__(self) -> WorkerSupervisor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.supervisor.stop()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self.exits += len(self.supervisor.run_once().exited)
            if self.exits > MAX_RESTARTS:
                return  # crash loop: stop restarting; the test fails on its asserts


def test_a_poison_job_fails_after_max_attempts_while_other_jobs_succeed(
    fault_system: SystemFactory, run_log: Path
) -> None:
    system = fault_system(CONFIG)
    system.start_api()
    system.start("dispatcher", "dispatcher")
    with WorkerSupervisor(system.env) as supervised:
        mallory, bob = system.tenant("mallory", "standard"), system.tenant("bob", "standard")
        system.wait_for_capacity(bob, 1)
        poison = mallory.post("/v1/jobs", json={
            "kind": "crash", "payload": {}, "max_attempts": MAX_ATTEMPTS})
        assert poison.status_code == 202, poison.text
        bystanders = []
        for n in range(4):
            response = bob.post("/v1/jobs", json={
                "kind": "tracked", "payload": {"seconds": 0.2, "n": n},
                "max_attempts": BYSTANDER_ATTEMPTS})
            assert response.status_code == 202, response.text
            bystanders.append(response.json()["id"])

        final = wait_terminal(mallory, poison.json()["id"], timeout=120)
        finished = [wait_terminal(bob, job_id, timeout=60) for job_id in bystanders]

    assert final["status"] == "failed"
    assert final["attempt"] == MAX_ATTEMPTS
    assert "lease" in final["error"] and f"{MAX_ATTEMPTS} of {MAX_ATTEMPTS}" in final["error"]
    assert 1 <= supervised.exits <= MAX_ATTEMPTS  # one crash per attempt at most: no loop
    assert {job["status"] for job in finished} == {"succeeded"}
    check_invariants(
        system.env["TIERQ_DATABASE_URL"], [poison.json()["id"], *bystanders],
        tier_caps={"standard": 1}, run_log=run_log,
    )
