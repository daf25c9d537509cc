"""PostgreSQL stops for a few seconds under load: 503s with Retry-After, then it all resumes.

While the database is down the API answers 503 ``unavailable`` (never 500, never a hung
request) and ``/readyz`` fails; the dispatcher and the worker ride it out and carry on by
themselves when it is back; every job that got a 202 finishes, once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import sqlalchemy as sa

from jobs.admission.submit import Submission, submit
from jobs.core.cadence import UNCOMMITTED_GRACE_S
from jobs.core.errors import Unavailable
from jobs.dispatch.dispatcher import Dispatcher
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.direct import DirectConnection
from jobs.store.migrate import upgrade
from jobs.store.pipeline import OneTrip
from tests.faults.checks import check_invariants
from tests.faults.conftest import SystemFactory
from tests.faults.load import outage_under_load
from tests.faults.servers import ThrowawayPostgres, ThrowawayRedis
from tests.integration.stand_in import register_stand_ins
from workers.handlers import default_registry

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

OUTAGE_S = 4.0
# Two worker slots; a standard tenant may hold one.
CONFIG = """
[tiers.standard]
base_priority = 10
max_wait_s = 300
tenant_share = 0.5
"""


def test_a_database_outage_under_load_answers_503_and_loses_no_accepted_job(
    fault_system: SystemFactory, fault_pg: ThrowawayPostgres, run_log: Path
) -> None:
    system = fault_system(CONFIG)
    system.start_api()
    system.start("dispatcher", "dispatcher")
    system.start("worker", "worker", "--concurrency", "2")
    tenants = [system.tenant(name, "standard") for name in ("acme", "globex")]
    system.wait_for_capacity(tenants[0], 2)
    clients = [httpx.Client(base_url=system.url, headers=c.headers) for c in tenants]
    system.clients.extend(clients)

    load = outage_under_load(
        system.url,
        clients,
        stop=lambda: fault_pg.stop("immediate"),
        start=fault_pg.start,
        outage_s=OUTAGE_S,
    )
    jobs = check_invariants(
        system.env["TIERQ_DATABASE_URL"], load.accepted, tier_caps={"standard": 1},
        run_log=run_log,
    )
    assert {job.status.value for job in jobs.values()} == {"succeeded"}


@pytest.mark.parametrize("keyed", [False, True])
def test_a_submit_whose_commit_is_cut_off_is_not_half_accepted(
    fault_pg: ThrowawayPostgres, fault_redis: ThrowawayRedis, keyed: bool
) -> None:
    """The database dies during the COMMIT of a job: the answer is 503, and the job either
    exists and runs or is gone everywhere; never a row the index does not know about. A
    plain submit's INSERT is sent alone, its own transaction (``jobs.store.direct``): cut off
    as it is sent, whether it committed is not known either; a keyed one commits in a
    session, cut off just before its COMMIT."""
    url = fault_pg.create_database()
    upgrade(url)
    runtime = Runtime.from_settings(
        load_settings(database_url=url, redis_url=fault_redis.url,
                      policy={"pool_concurrency": 1})
    )
    register_stand_ins(runtime)  # the worker this test plays by hand
    try:
        with runtime.sessions.begin() as session:
            tenant = tenants_sql.create_tenant(
                session, name="acme", tier="standard", api_key_hash="h", now=time.time()
            )

        def stop_before_commit(_conn: sa.Connection) -> None:
            fault_pg.stop("immediate")  # the COMMIT is about to be sent: it never arrives

        def stopped_as_sent(execute: Any) -> Any:
            def stop_as_sent(self: DirectConnection, stmt: Any, params: Any = None) -> Any:
                fault_pg.stop("immediate")  # the INSERT is about to be sent: it never arrives
                return execute(self, stmt, params)

            return stop_as_sent

        assert runtime.direct is not None
        sa.event.listen(runtime.engine, "commit", stop_before_commit)
        with mock.patch.object(DirectConnection, "execute",
                               stopped_as_sent(DirectConnection.execute)), \
                mock.patch.object(OneTrip, "execute", stopped_as_sent(OneTrip.execute)), \
                pytest.raises(Unavailable, match="unconfirmed"):
            submit(runtime, default_registry(""), tenant, Submission(
                kind="echo", payload={}, idempotency_key="k" if keyed else None))
        sa.event.remove(runtime.engine, "commit", stop_before_commit)
        # Unconfirmed, so still indexed: the dispatcher runs it if its row shows up...
        assert runtime.index.tenant_queued(tenant.id) == 1
        fault_pg.start()
        with runtime.sessions() as session:
            assert jobs_sql.list_jobs(
                session, tenant_id=tenant.id, status=None, limit=10, cursor=None
            ) == ([], None)
        # ... and drops it once it is clear that the row never will.
        Dispatcher(runtime, _NoPublisher()).run_once(time.time() + UNCOMMITTED_GRACE_S + 1)
        assert runtime.index.tenant_queued(tenant.id) == 0
        assert runtime.index.inflight() == 0
        check_invariants(url, [], tier_caps={"standard": 1})  # no job was accepted, or left
    finally:
        runtime.close()


class _NoPublisher:
    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        raise AssertionError(f"{job_id} has no row: it must not be published")
