"""A database outage stops no dispatch and strands no job.

A dispatch needs no SQL: it leases in Redis and publishes, and the row stays queued until a
worker's start moves it, so jobs are dispatched while the database is down. The chores that
decide from SQL change Redis first and SQL second (the reaper takes lapsed leases, then reads
their rows; expiry takes due jobs off the due list, then expires their rows); when SQL fails
in between, they put back what they took, so their decisions wait for the database: once it
is back, a reaped job is indexed again, a due one expired. A whole round in the outage stops
at its upkeep's first SQL read (the caps' overrides), before the reaper or expiry is reached,
so those two are driven on their own here, each meeting the outage inside its own
transaction. Driven with explicit times against a throwaway PostgreSQL that the test stops;
at the end a worker in the test process runs what is left (``drain``) and the invariants must
hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import sqlalchemy.exc

from jobs.admission.submit import Submission, submit
from jobs.core.cadence import FEED_PERIOD_S, MAINTENANCE_PERIOD_S
from jobs.core.domain import Job, Tenant
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher, DispatchStats
from jobs.execution.attempt import execute
from jobs.index.base import Entry
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.migrate import upgrade
from tests.faults.checks import check_invariants
from tests.faults.servers import ThrowawayPostgres, ThrowawayRedis
from tests.integration.stand_in import register_stand_ins
from workers.handlers import default_registry

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

LEASE_TTL_S = 5.0
# Rounds after the outage, each this far apart: time enough for the leases taken in the
# failed round to lapse and be dealt with.
ROUNDS, ROUND_STEP_S = 8, LEASE_TTL_S
# A pool of 2 slots: a standard tenant's cap is max(1, floor(2 × 0.10)) = 1.
TIER_CAPS = {"standard": 1}


@dataclass
class RecordingPublisher:
    """Records each message; with a ``worker``, hands it over at once (no broker)."""

    sent: list[tuple[str, int]] = field(default_factory=list)
    worker: Callable[[str, int], object] | None = None

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        self.sent.append((job_id, attempt))
        if self.worker is not None:
            self.worker(job_id, attempt)


def drain(runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher,
          job_ids: list[str], now: float) -> None:
    """A worker comes back: rounds (``now`` on) run every job left, then the invariants."""
    clock = [now]
    publisher.worker = lambda job_id, attempt: execute(
        runtime, default_registry(""), job_id, attempt, worker_id="drain",
        clock=lambda: clock[0],
    )
    for _ in range(ROUNDS):
        if all(load(runtime, job_id).terminal for job_id in job_ids):
            break
        clock[0] += ROUND_STEP_S
        dispatcher.run_once(clock[0])
    check_invariants(runtime.settings.resolved_database_url(), job_ids, tier_caps=TIER_CAPS)


@pytest.fixture
def runtime(fault_pg: ThrowawayPostgres, fault_redis: ThrowawayRedis) -> Iterator[Runtime]:
    url = fault_pg.create_database()
    upgrade(url)
    settings = load_settings(
        database_url=url, redis_url=fault_redis.url,
        policy={"pool_concurrency": 2, "lease_ttl_s": LEASE_TTL_S},
    )
    rt = Runtime.from_settings(settings)
    register_stand_ins(rt)  # the workers these tests play by hand
    yield rt
    rt.close()


def make_tenant(runtime: Runtime, name: str = "acme") -> Tenant:
    with runtime.sessions.begin() as session:
        return tenants_sql.create_tenant(
            session, name=name, tier="standard", api_key_hash=name, now=time.time()
        )


def load(runtime: Runtime, job_id: str) -> Job:
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None
    return job


@contextmanager
def sql_down(pg: ThrowawayPostgres) -> Iterator[None]:
    """The database is down inside the block, and back after it."""
    pg.stop("immediate")
    try:
        yield
    finally:
        pg.start()


def rounds_after(dispatcher: Dispatcher, now: float) -> None:
    for n in range(1, ROUNDS + 1):
        dispatcher.run_once(now + n * ROUND_STEP_S)


def test_dispatch_goes_on_while_sql_is_down(
    runtime: Runtime, fault_pg: ThrowawayPostgres
) -> None:
    publisher = RecordingPublisher()
    # One job a dispatch: each of the two rounds in the outage has one to send.
    dispatcher = Dispatcher(runtime, publisher, batch_size=1)
    now = time.time()
    dispatcher.run_once(now)  # caps and overrides are read; the next round goes straight on
    job_ids = [
        submit(runtime, default_registry(""), make_tenant(runtime, name),
               Submission(kind="echo", payload={})).progress.job.id
        for name in ("acme", "globex")
    ]

    with sql_down(fault_pg):
        # A doorbell's round (no upkeep, the feed not due) needs nothing of SQL.
        stats = dispatcher.run_once(now + FEED_PERIOD_S / 2, maintain=False)
        assert stats.dispatched == 1
        # A round with its upkeep dispatches first, then stops at the upkeep's SQL read.
        with pytest.raises(sqlalchemy.exc.OperationalError):
            dispatcher.run_once(now + MAINTENANCE_PERIOD_S)

    assert sorted(publisher.sent) == sorted((job_id, 1) for job_id in job_ids)
    for job_id in job_ids:  # nothing was written: each row waits for its worker's start
        job = load(runtime, job_id)
        assert (job.status, job.attempt, job.starts) == (Status.QUEUED, 1, 0)
    # No worker took those messages: their leases lapse and the jobs are sent again.
    drain(runtime, dispatcher, publisher, job_ids, now + MAINTENANCE_PERIOD_S)


def test_a_lease_reaped_in_a_failed_round_still_requeues_its_job(
    runtime: Runtime, fault_pg: ThrowawayPostgres
) -> None:
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    tenant = make_tenant(runtime)
    job_id = submit(runtime, default_registry(""), tenant,
                    Submission(kind="echo", payload={})).progress.job.id
    now = time.time()
    assert dispatcher.run_once(now).dispatched == 1  # its worker then vanishes
    lapsed = now + LEASE_TTL_S + 1

    with sql_down(fault_pg):
        with pytest.raises(sqlalchemy.exc.OperationalError):
            dispatcher.reap.run(lapsed, DispatchStats())  # the lease is taken; SQL fails
        # Back as it was (lapsed, for the next run): without its row the reaper decides
        # nothing, and the job is neither lost nor offered again.
        assert runtime.index.entries_of([job_id]) == {
            job_id: Entry(job_id=job_id, attempt=1, leased=True)
        }

    rounds_after(dispatcher, lapsed)

    # Reaped once SQL answers: the row is queued (no worker started it), so the job is
    # indexed again as it was and sent again as the same attempt, nothing charged.
    assert publisher.sent[0] == (job_id, 1) and len(publisher.sent) > 1
    assert set(publisher.sent) == {(job_id, 1)}
    job = load(runtime, job_id)
    assert (job.status, job.attempt, job.starts) == (Status.QUEUED, 1, 0)
    drain(runtime, dispatcher, publisher, [job_id], lapsed + ROUNDS * ROUND_STEP_S)


def test_a_job_due_to_expire_in_a_failed_round_still_expires(
    runtime: Runtime, fault_pg: ThrowawayPostgres
) -> None:
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    tenant = make_tenant(runtime)
    now = time.time()
    # The tenant's one slot (cap 1 on a pool of 2) is taken: the job can only wait, and expire.
    # Its max_wait_s leaves room for the slot's told wait (one mean service time), so it is
    # accepted; the running job does not finish before it expires.
    first = submit(runtime, default_registry(""), tenant, Submission(kind="echo", payload={}))
    assert dispatcher.run_once(now).dispatched == 1
    max_wait_s = 2 * runtime.policy.mean_service_s
    job_id = submit(
        runtime, default_registry(""), tenant,
        Submission(kind="echo", payload={}, max_wait_s=max_wait_s),
    ).progress.job.id
    due = now + max_wait_s + 2

    with sql_down(fault_pg):
        with pytest.raises(sqlalchemy.exc.OperationalError):
            dispatcher.expire.run(due, DispatchStats())  # taken off the due list; SQL fails
        # Back in the index as it was, its deadline with it: the next run expires it.
        assert runtime.index.entries_of([job_id]) == {
            job_id: Entry(job_id=job_id, attempt=1, leased=False)
        }

    rounds_after(dispatcher, due)

    assert load(runtime, job_id).status is Status.EXPIRED
    drain(runtime, dispatcher, publisher, [first.progress.job.id, job_id],
          due + ROUNDS * ROUND_STEP_S)
