"""A dispatcher round cut short by a database outage loses no job.

Each round changes Redis first (pop and lease, reap, expire) and SQL second; when SQL fails
in between, the round's Redis changes must not strand a job: once the database is back, a
popped job is dispatched, a reaped one re-queued, a due one expired. Driven with
``run_once`` and explicit times against a throwaway PostgreSQL that the test stops; at the
end a worker in the test process runs what is left (``drain``) and the invariants must hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import sqlalchemy.exc

from jobs.admission.submit import Submission, submit
from jobs.core.domain import Job, Tenant
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.execution.attempt import execute
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.migrate import upgrade
from tests.faults.checks import check_invariants
from tests.faults.servers import ThrowawayPostgres, ThrowawayRedis
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

    def publish(self, job_id: str, attempt: int, tier: str) -> None:
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
    yield rt
    rt.close()


def make_tenant(runtime: Runtime) -> Tenant:
    with runtime.sessions.begin() as session:
        return tenants_sql.create_tenant(
            session, name="acme", tier="standard", api_key_hash="h", now=time.time()
        )


def load(runtime: Runtime, job_id: str) -> Job:
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None
    return job


def cut_short(dispatcher: Dispatcher, pg: ThrowawayPostgres, now: float) -> None:
    """One round while the database is down: it fails part-way, as the loop expects."""
    pg.stop("immediate")
    with pytest.raises(sqlalchemy.exc.OperationalError):
        dispatcher.run_once(now)
    pg.start()


def rounds_after(dispatcher: Dispatcher, now: float) -> None:
    for n in range(1, ROUNDS + 1):
        dispatcher.run_once(now + n * ROUND_STEP_S)


def test_a_job_popped_in_a_failed_round_is_dispatched_later(
    runtime: Runtime, fault_pg: ThrowawayPostgres
) -> None:
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    tenant = make_tenant(runtime)
    now = time.time()
    dispatcher.run_once(now)  # caps and overrides are read; the next round goes straight on
    job = submit(runtime, default_registry(""), tenant, Submission(kind="echo", payload={}))
    cut_short(dispatcher, fault_pg, now + 1)  # popped and leased in Redis; SQL not reached

    rounds_after(dispatcher, now + 1)

    # Published at last (no worker runs it here, so later rounds may reap it again).
    assert publisher.sent[0] == (job.progress.job.id, 1)
    drain(runtime, dispatcher, publisher, [job.progress.job.id], now + 1 + ROUNDS * ROUND_STEP_S)


def test_a_lease_reaped_in_a_failed_round_still_requeues_its_job(
    runtime: Runtime, fault_pg: ThrowawayPostgres
) -> None:
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    tenant = make_tenant(runtime)
    job = submit(runtime, default_registry(""), tenant, Submission(kind="echo", payload={}))
    now = time.time()
    assert dispatcher.run_once(now).dispatched == 1  # its worker then vanishes
    cut_short(dispatcher, fault_pg, now + LEASE_TTL_S + 1)  # the lease is reaped; SQL fails

    rounds_after(dispatcher, now + LEASE_TTL_S + 1)

    assert (job.progress.job.id, 2) in publisher.sent  # re-queued as attempt 2, sent again
    assert load(runtime, job.progress.job.id).attempt >= 2
    drain(runtime, dispatcher, publisher, [job.progress.job.id],
          now + LEASE_TTL_S + 1 + ROUNDS * ROUND_STEP_S)


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
    job = submit(
        runtime, default_registry(""), tenant,
        Submission(kind="echo", payload={}, max_wait_s=max_wait_s),
    )
    due = now + max_wait_s + 2
    cut_short(dispatcher, fault_pg, due)  # taken off the due list; SQL fails

    rounds_after(dispatcher, due)

    assert load(runtime, job.progress.job.id).status is Status.EXPIRED
    drain(runtime, dispatcher, publisher, [first.progress.job.id, job.progress.job.id],
          due + ROUNDS * ROUND_STEP_S)
