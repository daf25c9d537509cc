"""Redis stops for a few seconds under load, its data kept: 503s, then it all resumes.

This is an outage, not a loss: the server restarts from its append-only file, so the index
and the broker queues come back as they were (an emptied Redis is rebuilt from SQL, which
is another test's matter). While Redis is down the API answers 503 ``unavailable`` (never
500, never a hung request) and ``/readyz`` fails; afterwards the worker reconnects to the
broker, the dispatcher carries on, and every job that got a 202 finishes, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults.checks import check_invariants
from tests.faults.conftest import SystemFactory
from tests.faults.load import outage_under_load
from tests.faults.servers import ThrowawayRedis

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

OUTAGE_S = 4.0
# Longer than the outage, as a deployment's should be (the default is 30 s): leases and
# worker registrations outlive it, so no job is taken from a worker that is still running it.
LEASE_TTL_S = 10.0
# Two worker slots; a standard tenant may hold one.
CONFIG = """
[tiers.standard]
base_priority = 10
max_wait_s = 300
tenant_share = 0.5
"""


@pytest.fixture
def durable_redis() -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis(persistent=True)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


def test_a_redis_outage_under_load_answers_503_and_resumes_by_itself(
    fault_system: SystemFactory, durable_redis: ThrowawayRedis, run_log: Path
) -> None:
    system = fault_system(CONFIG, redis=durable_redis, lease_ttl_s=LEASE_TTL_S)
    system.start_api()
    system.start("dispatcher", "dispatcher")
    system.start("worker", "worker", "--concurrency", "2")
    tenants = [system.tenant(name, "standard") for name in ("acme", "globex")]
    system.wait_for_capacity(tenants[0], 2)
    clients = [httpx.Client(base_url=system.url, headers=c.headers) for c in tenants]
    system.clients.extend(clients)

    load = outage_under_load(
        system.url, clients, stop=durable_redis.stop, start=durable_redis.start, outage_s=OUTAGE_S
    )
    jobs = check_invariants(
        system.env["TIERQ_DATABASE_URL"], load.accepted, tier_caps={"standard": 1},
        run_log=run_log,
    )
    assert {job.status.value for job in jobs.values()} == {"succeeded"}


def test_a_keyed_retry_during_a_redis_outage_gets_its_accepted_job(
    fault_system: SystemFactory, durable_redis: ThrowawayRedis
) -> None:
    """The retry of work accepted before the outage is answered with that job (200), read
    from SQL, while new work is refused (503): a client that lost the first answer is not
    told its job failed."""
    system = fault_system(CONFIG, redis=durable_redis, lease_ttl_s=LEASE_TTL_S)
    system.start_api()
    tenant = system.tenant("acme", "standard")
    client = httpx.Client(base_url=system.url, headers=tenant.headers, timeout=30)
    system.clients.append(client)
    body = {"kind": "sleep", "payload": {"seconds": 1}, "idempotency_key": "before"}
    first = client.post("/v1/jobs", json=body)
    assert first.status_code == 202, first.text
    durable_redis.stop()
    try:
        again = client.post("/v1/jobs", json=body)
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
        fresh = client.post("/v1/jobs", json={**body, "idempotency_key": "during"})
        assert fresh.status_code == 503, fresh.text
        assert fresh.json()["error"]["type"] == "unavailable"
    finally:
        durable_redis.start()
