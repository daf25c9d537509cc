"""A leader that stalls inside a transaction holding the ``leadership`` row does not stop
failover.

The stall is the one the reaper and the reconciler can leave: their transactions begin with
``holds_lead`` (an UPDATE that holds the row until COMMIT), and a process paused there
(SIGSTOP, a long GC pause, a hung network) keeps the row locked. Here that transaction is a
real connection of the test process, opened and bounded as a dispatcher's is
(``Runtime.from_settings``, ``holds_lead`` with the leader's own token, then a decision of
its own on a job), kept busy until the successor is seen waiting on the row, then left idle
in the transaction; the leader's process itself is SIGSTOPped, so its lock lapses. The
standby must take over and dispatch a job submitted meanwhile within a few leader TTLs: its
claim waits at most ``lock_timeout`` at a time, renewing its lock between tries, and the
server ends the stalled transaction (``idle_in_transaction_session_timeout``), whose decision
then never lands. Woken, the stalled side gets an error and the former leader stands by.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import sqlalchemy.exc
from sqlalchemy.orm import Session

from jobs.core.states import Status
from jobs.dispatch import loop
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import upkeep as upkeep_sql
from tests.e2e.harness import Process, System, wait_until
from tests.faults.conftest import SystemFactory
from tests.faults.handlers import read_runs
from tests.faults.leader_lock import leader_token, pid_of
from tests.faults.servers import ThrowawayRedis

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

LEADER_TTL_S = 2.0
# From the moment the holder stalls: the server ends it after a TTL idle, the standby's next
# try comes within a lock wait and a retry (2/3 of the TTL), then a full pass, a round and a
# 0.1 s run; the rest is room for a loaded machine. Without bounds it never comes.
FAILOVER_BOUND_S = 4 * LEADER_TTL_S + 6
CONFIG = """
[tiers.standard]
base_priority = 10
max_wait_s = 300
tenant_share = 1.0
"""


def sql_leader(engine: sa.Engine) -> str | None:
    with engine.connect() as connection:
        holder: str | None = connection.execute(
            sa.text("SELECT holder FROM leadership WHERE id = 1")
        ).scalar()
    return holder


def waiting_on_the_row(engine: sa.Engine) -> bool:
    """Some session (the standby's claim) waits on a lock, in a statement on the row."""
    with engine.connect() as connection:
        waiting = connection.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query ILIKE '%leadership%' AND pid <> pg_backend_pid()"
        )).scalar()
    return bool(waiting)


def lines_with(process: Process, event: str) -> int:
    return sum(event in line for line in process.log.read_text(errors="replace").splitlines())


@contextmanager
def stopped(process: Process) -> Iterator[None]:
    """SIGSTOP ``process`` (a pause: it holds its sockets, does nothing); SIGCONT on the way
    out, whatever happened."""
    os.kill(process.popen.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.popen.pid, signal.SIGCONT)


def status_of(client: httpx.Client, job_id: str) -> str:
    status: str = client.get(f"/v1/jobs/{job_id}").json()["status"]
    return status


def test_a_leader_stalled_inside_a_transaction_does_not_stop_failover(
    fault_system: SystemFactory, fault_redis: ThrowawayRedis, run_log: Path
) -> None:
    system: System = fault_system(CONFIG)
    system.env["TIERQ_POLICY__LEADER_TTL_S"] = str(LEADER_TTL_S)
    system.start_api()
    worker = system.start("worker", "worker", "--concurrency", "1")
    prefix = system.env["TIERQ_KEY_PREFIX"]
    url = system.env["TIERQ_DATABASE_URL"]
    observer = sa.create_engine(url)
    holder_runtime = Runtime.from_settings(load_settings(
        database_url=url, redis_url=fault_redis.url, key_prefix=prefix,
        policy={"leader_ttl_s": LEADER_TTL_S},
    ))
    stalled: Session | None = None
    try:
        first = system.start("dispatcher-1", "dispatcher")
        token = wait_until(lambda: (t := leader_token(fault_redis, prefix)) is not None
                           and pid_of(t) == first.popen.pid and t)
        wait_until(lambda: sql_leader(observer) == token)  # it claimed SQL too
        second = system.start("dispatcher-2", "dispatcher")
        wait_until(lambda: "dispatcher.standby" in second.log.read_text(errors="replace"))
        tenant = system.tenant("acme", "standard")
        system.wait_for_capacity(tenant, 1)

        # The leader's reaper transaction: it checks its lead, and stalls before COMMIT.
        stalled = holder_runtime.sessions()
        stalled.begin()
        assert upkeep_sql.holds_lead(stalled, token)
        with stopped(first):
            # The worker paused a moment: the submit offers the job to its free slot, and
            # the job is still queued when the stalled transaction decides about it.
            with stopped(worker):
                response = tenant.post("/v1/jobs", json={"kind": "tracked",
                                                         "payload": {"seconds": 0.1}})
                assert response.status_code == 202, response.text
                job_id = response.json()["id"]
                job = jobs_sql.get_job(stalled, job_id)
                assert job is not None
                # A decision the stalled transaction made: it must never land.
                assert jobs_sql.transition(stalled, job_id, src=Status.QUEUED,
                                           attempt=job.attempt, dst=Status.EXPIRED,
                                           now=time.time())
            # Busy (each statement restarts the idle clock) until the standby, leading in
            # Redis now, waits on the row; then idle in the transaction: the stall.
            deadline = time.monotonic() + 30
            while not waiting_on_the_row(observer):
                assert time.monotonic() < deadline, "the standby never claimed the lead"
                stalled.execute(sa.text("SELECT 1"))
                time.sleep(0.05)
            stalled_at = time.monotonic()

            # The job runs (its submit offered it to the free slot; its start waited for the
            # stalled transaction's row lock), and the standby's claim of the lead in SQL
            # goes through: both within the bound.
            deadline = stalled_at + FAILOVER_BOUND_S

            def failed_over() -> bool:
                successor = leader_token(fault_redis, prefix)
                return (status_of(tenant, job_id) == "succeeded" and successor is not None
                        and sql_leader(observer) == successor)

            while not failed_over():
                assert time.monotonic() < deadline, (
                    f"no failover: the job is {status_of(tenant, job_id)}, SQL names "
                    f"{sql_leader(observer)}, {FAILOVER_BOUND_S} s after the leader stalled "
                    "holding the leadership row"
                )
                time.sleep(0.1)

            # The stalled side wakes: its session was ended, its decision rolled back; to
            # the dispatcher's loop that is an outage to ride out, not a crash.
            with pytest.raises(sqlalchemy.exc.DBAPIError) as woke:
                stalled.commit()
            assert woke.value.connection_invalidated
            assert loop.transient(woke.value)

        successor = leader_token(fault_redis, prefix)
        assert pid_of(successor) == second.popen.pid
        assert sql_leader(observer) == successor
        with holder_runtime.sessions() as session:
            row = jobs_sql.get_job(session, job_id)
        assert row is not None and row.status is Status.SUCCEEDED
        assert [run.what for run in read_runs(run_log)[job_id]].count("start") == 1
        # The standby kept its lock through the timed-out waits (it never stepped down),
        # and said so once.
        assert lines_with(second, "dispatcher.leading") == 1
        assert lines_with(second, "dispatcher.lock_wait_timeout") == 1
        # The former leader, resumed, finds its lock gone and stands by; its loop lives on.
        wait_until(lambda: "renewal refused" in first.log.read_text(errors="replace"),
                   timeout=10 * LEADER_TTL_S)
        assert first.popen.poll() is None
    finally:
        if stalled is not None:
            stalled.close()
        holder_runtime.close()
        observer.dispose()
