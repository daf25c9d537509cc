"""A dispatch writes nothing to SQL: the worker's start is where a lease meets its row, and
settles what it finds there (``jobs.execution.attempt``: ``_not_started``, ``_not_committed``,
``_before_start``), against real SQL and a real Redis index. Each test leases jobs as a
dispatch round does (the index only), then calls ``execute`` as the worker's task would."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa

import jobs.execution.attempt as attempt_module
from jobs.core.cadence import UNCOMMITTED_GRACE_S, UNCOMMITTED_RETRY_S, UNCOMMITTED_WAIT_S
from jobs.core.domain import Job, NewJob, Tenant
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.execution.attempt import Handover, execute
from jobs.execution.handlers import JobContext
from jobs.execution.prestart import PRE_STARTS, Landing
from jobs.execution.registry import HandlerRegistry
from jobs.index import redis_leases
from jobs.index.base import Entry, IndexedJob, Lease
from jobs.index.keys import IndexKeys
from jobs.index.lean_script import one_trip
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.direct import DirectPool, direct_pool
from jobs.store.engine import make_engine, make_sessionmaker
from jobs.store.pipeline import locked
from tests.handlers_for_tests import RecordingHandler
from tests.integration.held_commits import HeldCommit

pytestmark = pytest.mark.integration

LEASE_TTL_S = 30.0
WORKER = "worker-test@host"


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    yield from runtime_on(db_url, redis_client, key_prefix)


@pytest.fixture
def pg_runtime(pg_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    """On PostgreSQL only: the commit lock is PostgreSQL's (SQLite offers after the COMMIT)."""
    yield from runtime_on(pg_url, redis_client, key_prefix)


def runtime_on(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(database_url=db_url, key_prefix=key_prefix,
                             policy={"lease_ttl_s": LEASE_TTL_S})
    engine = make_engine(db_url)
    index = RedisIndex(redis_client, key_prefix)
    index.set_caps({name: 10 for name in settings.tiers})
    index.set_generation("1")  # whole, as a leader's rebuild leaves it: hand-overs lease
    rt = Runtime(settings=settings, policy=settings.build_policy(), engine=engine,
                 sessions=make_sessionmaker(engine), redis=redis_client, index=index,
                 direct=direct_pool(engine, size=4))
    yield rt
    if rt.direct is not None:
        rt.direct.close()
    engine.dispose()


@pytest.fixture
def tenant(runtime: Runtime) -> Tenant:
    return new_tenant(runtime)


def new_tenant(runtime: Runtime) -> Tenant:
    with runtime.sessions.begin() as session:
        return tenants_sql.create_tenant(
            session, name="acme", tier="standard", api_key_hash="hash", now=time.time())


class ProbeHandler(RecordingHandler):
    """Records each call and the row's status and attempt as its handler saw them."""

    kind = "probe"

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.runtime = runtime
        self.seen: list[tuple[Status, int]] = []

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        row = load(self.runtime, ctx.job_id)
        self.seen.append((row.status, row.attempt))
        return super().run(ctx, payload)


@pytest.fixture
def probe(runtime: Runtime) -> ProbeHandler:
    return ProbeHandler(runtime)


@pytest.fixture
def registry(probe: ProbeHandler) -> HandlerRegistry:
    return HandlerRegistry([probe])


def new_job(runtime: Runtime, tenant: Tenant, now: float, **kw: Any) -> NewJob:
    return NewJob(id=new_job_id(now), tenant_id=tenant.id, tier=tenant.tier, kind="probe",
                  payload={}, order_key=runtime.policy.order_key(tenant.tier, now),
                  enqueued_at=now, **kw)


def insert(runtime: Runtime, new: NewJob) -> Job:
    with runtime.sessions.begin() as session:
        return jobs_sql.insert_job(session, new)


def index_entry(runtime: Runtime, new: NewJob) -> None:
    entry = IndexedJob(job_id=new.id, tenant=new.tenant_id, tier=new.tier,
                       order_key=new.order_key, start_by=new.start_by)
    assert runtime.index.admit(entry, bound=1000).accepted


def submit(runtime: Runtime, tenant: Tenant, **kw: Any) -> Job:
    """What the API does: insert the job, then index it."""
    new = new_job(runtime, tenant, time.time(), **kw)
    job = insert(runtime, new)
    index_entry(runtime, new)
    return job


def dispatch(runtime: Runtime, *, now: float | None = None) -> Lease:
    """A dispatch round's part: one lease, taken in the index only."""
    (lease,) = runtime.index.dispatch(1, now=time.time() if now is None else now,
                                      lease_ttl_s=LEASE_TTL_S)
    return lease


def load(runtime: Runtime, job_id: str) -> Job:
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None
    return job


def doorbell(runtime: Runtime) -> list[Any]:
    """The tokens waiting in the dispatcher's doorbell (``jobs.index.wake``)."""
    return list(runtime.redis.lrange(f"{runtime.settings.key_prefix}wake", 0, -1))


# -- a lease meets a queued row: it starts --


def test_a_queued_row_leased_by_a_dispatch_starts_with_the_messages_dispatched_at(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler
) -> None:
    job = submit(runtime, tenant)
    leased_at = time.time() - 2.5
    lease = dispatch(runtime, now=leased_at)
    assert (lease.job_id, lease.attempt) == (job.id, 1)
    assert load(runtime, job.id).status is Status.QUEUED  # the dispatch wrote nothing to SQL

    outcome = execute(runtime, registry, job.id, lease.attempt, worker_id=WORKER,
                      dispatched_at=leased_at)

    assert outcome == "succeeded"
    assert probe.seen == [(Status.RUNNING, 1)]  # queued -> running, then the handler
    done = load(runtime, job.id)
    assert (done.status, done.attempt, done.starts) == (Status.SUCCEEDED, 1, 1)
    assert done.dispatched_at == pytest.approx(leased_at, abs=1e-3)
    assert done.started_at is not None and done.started_at >= leased_at + 2.0
    assert runtime.index.inflight() == 0


# -- no row: not committed yet, or a failed submit's leftover --


def test_a_lease_whose_row_is_not_committed_yet_is_put_back_then_runs(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler
) -> None:
    now = runtime.index.now()
    new = new_job(runtime, tenant, now, max_wait_s=600)
    index_entry(runtime, new)  # the API indexes first; its INSERT has not committed
    lease = dispatch(runtime, now=now)
    assert lease.job_id == new.id

    started = time.monotonic()
    outcome = execute(runtime, registry, new.id, 1, worker_id=WORKER, clock=lambda: now)

    assert outcome == "stale" and probe.calls == []
    assert time.monotonic() - started >= UNCOMMITTED_WAIT_S  # it waited for the commit first
    # Back in the queue for the same attempt, held back for UNCOMMITTED_RETRY_S.
    assert runtime.index.entries_of([new.id]) == {
        new.id: Entry(job_id=new.id, attempt=1, leased=False)}
    assert runtime.index.inflight() == 0 and runtime.index.position(new.id) is None
    assert runtime.index.tenant_queued(tenant.id) == 1
    depth = runtime.index.tier_depths([tenant.tier])[tenant.tier]
    # It waits, held back: counted in its tier, not its oldest queued job (``TierDepth``).
    assert (depth.queued, depth.oldest_order_key) == (1, None)
    early = now + UNCOMMITTED_RETRY_S - 0.01
    assert runtime.index.dispatch(1, now=early, lease_ttl_s=LEASE_TTL_S) == []

    insert(runtime, new)  # the commit lands
    due = now + UNCOMMITTED_RETRY_S
    again = dispatch(runtime, now=due)

    assert (again.job_id, again.attempt) == (new.id, 1)
    assert (again.order_key, again.start_by) == (new.order_key, new.start_by)
    assert execute(runtime, registry, new.id, 1, worker_id=WORKER, clock=lambda: due,
                   dispatched_at=due) == "succeeded"
    assert probe.seen == [(Status.RUNNING, 1)]
    assert load(runtime, new.id).status is Status.SUCCEEDED
    assert runtime.index.inflight() == 0


def test_a_lease_whose_commit_lands_while_its_slot_waits_runs_at_once(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler
) -> None:
    """The commit comes a moment after the lease: the slot waits for it and runs the job,
    with no put-back for a dispatcher (none runs here) to offer again."""
    now = runtime.index.now()
    new = new_job(runtime, tenant, now, max_wait_s=600)
    index_entry(runtime, new)
    lease = dispatch(runtime, now=now)
    committer = threading.Timer(0.1, insert, args=(runtime, new))
    committer.start()

    outcome = execute(runtime, registry, new.id, 1, worker_id=WORKER, dispatched_at=now)
    committer.join()

    assert (lease.job_id, outcome) == (new.id, "succeeded")
    assert probe.seen == [(Status.RUNNING, 1)]
    done = load(runtime, new.id)
    assert (done.status, done.attempt, done.starts) == (Status.SUCCEEDED, 1, 1)
    assert runtime.index.inflight() == 0 and runtime.index.tenant_queued(tenant.id) == 0


def locked_start(direct: DirectPool, job_id: str, *, now: float, wait_s: float) -> Job | None:
    """A worker's start of a job whose submit may be committing (``jobs.execution.attempt``)."""
    with jobs_sql.once_committed(direct, job_id, wait_s=wait_s) as connection:
        return None if connection is None else jobs_sql.start(
            connection, job_id, attempt=1, now=now, token="t")


def direct_of(runtime: Runtime) -> DirectPool:
    assert runtime.direct is not None, "PostgreSQL has direct connections"
    return runtime.direct


def await_lock_wait(runtime: Runtime) -> None:
    """Until a session waits for an advisory lock: the start has met the commit lock."""
    deadline = time.monotonic() + 10
    while True:
        with runtime.sessions() as session:
            waiting = session.execute(sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )).scalar_one()
        if waiting:
            return
        assert time.monotonic() < deadline, "no start waited for the commit lock"
        time.sleep(0.01)


def attempt_in_thread(runtime: Runtime, registry: HandlerRegistry, lease: Lease, now: float,
                      outcomes: list[str]) -> threading.Thread:
    """The worker's attempt of ``lease`` on a thread of its own; its outcome to ``outcomes``."""
    worker = threading.Thread(target=lambda: outcomes.append(execute(
        runtime, registry, lease.job_id, lease.attempt, worker_id=WORKER, dispatched_at=now)))
    worker.start()
    return worker


def test_a_start_made_while_its_submit_holds_the_commit_lock_waits_for_the_commit(
    pg_runtime: Runtime,
) -> None:
    """A submit that finds a slot free offers its job before its COMMIT, holding the job's
    commit lock: a start that meets the lease then waits for the row, and starts it."""
    runtime, direct = pg_runtime, direct_of(pg_runtime)
    now = runtime.index.now()
    new = new_job(runtime, new_tenant(runtime), now)
    started: list[Job | None] = []
    with locked(direct, new.id) as connection:
        worker = threading.Thread(target=lambda: started.append(locked_start(
            direct, new.id, now=now, wait_s=30.0)))
        worker.start()
        await_lock_wait(runtime)
        assert started == []  # waiting on the lock, not on a read
        jobs_sql.insert_job(connection, new)  # sent with its COMMIT
    worker.join(10)

    (job,) = started
    assert job is not None and (job.id, job.status, job.attempt) == (new.id, Status.RUNNING, 1)
    assert load(runtime, new.id).status is Status.RUNNING


def test_a_start_gives_up_on_a_commit_lock_held_past_its_wait(pg_runtime: Runtime) -> None:
    """A submit that hangs inside its transaction holds no start for longer than the wait:
    the start says the row is not there, and the caller settles it as such."""
    runtime, direct = pg_runtime, direct_of(pg_runtime)
    now = runtime.index.now()
    new = new_job(runtime, new_tenant(runtime), now)
    with locked(direct, new.id) as connection:
        began = time.monotonic()
        assert locked_start(direct, new.id, now=now, wait_s=0.2) is None
        assert time.monotonic() - began >= 0.2
        jobs_sql.insert_job(connection, new)
    assert load(runtime, new.id).status is Status.QUEUED  # committed after, untouched


def test_a_lease_taken_before_its_submits_commit_runs_once_the_row_commits(
    pg_runtime: Runtime,
) -> None:
    """The whole early offer: the job is indexed and leased under the submit's commit lock,
    its INSERT commits a moment later, and the worker's attempt runs it once."""
    runtime, direct = pg_runtime, direct_of(pg_runtime)
    tenant = new_tenant(runtime)
    probe = ProbeHandler(runtime)
    now = runtime.index.now()
    new = new_job(runtime, tenant, now)
    outcomes: list[str] = []
    with locked(direct, new.id) as connection:
        index_entry(runtime, new)
        worker = attempt_in_thread(runtime, HandlerRegistry([probe]),
                                   dispatch(runtime, now=now), now, outcomes)
        await_lock_wait(runtime)
        jobs_sql.insert_job(connection, new)
    worker.join(30)

    assert outcomes == ["succeeded"]
    assert probe.seen == [(Status.RUNNING, 1)]
    done = load(runtime, new.id)
    assert (done.status, done.attempt, done.starts) == (Status.SUCCEEDED, 1, 1)
    assert runtime.index.inflight() == 0 and runtime.index.tenant_queued(tenant.id) == 0


def test_a_lease_whose_submit_rolls_back_under_the_lock_is_put_back(
    pg_runtime: Runtime,
) -> None:
    """The submit's transaction fails after the offer: its ROLLBACK ends the start's wait,
    no row is there, and the lease is settled as any uncommitted one (put back, held off)."""
    runtime, direct = pg_runtime, direct_of(pg_runtime)
    probe = ProbeHandler(runtime)
    now = runtime.index.now()
    new = new_job(runtime, new_tenant(runtime), now, max_wait_s=600)
    outcomes: list[str] = []
    with pytest.raises(RuntimeError), locked(direct, new.id):
        index_entry(runtime, new)
        worker = attempt_in_thread(runtime, HandlerRegistry([probe]),
                                   dispatch(runtime, now=now), now, outcomes)
        await_lock_wait(runtime)
        raise RuntimeError("the INSERT failed")
    worker.join(30)

    assert outcomes == ["stale"] and probe.calls == []
    assert runtime.index.entries_of([new.id]) == {
        new.id: Entry(job_id=new.id, attempt=1, leased=False)}


def test_a_lease_without_a_row_past_the_grace_is_dropped(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler
) -> None:
    now = runtime.index.now()
    new = new_job(runtime, tenant, now - UNCOMMITTED_GRACE_S - 1.0)
    index_entry(runtime, new)  # a submit that indexed its job, then failed to commit it
    assert dispatch(runtime, now=now).job_id == new.id

    outcome = execute(runtime, registry, new.id, 1, worker_id=WORKER, clock=lambda: now)

    assert outcome == "stale" and probe.calls == []
    assert runtime.index.entries_of([new.id]) == {}
    assert runtime.index.inflight() == 0 and runtime.index.tenant_queued(tenant.id) == 0
    assert runtime.index.dispatch(1, now=now + 60.0, lease_ttl_s=LEASE_TTL_S) == []


# -- a row that must not compute: it ends without its handler --


def test_a_queued_row_with_a_cancel_requested_ends_cancelled_unrun(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler
) -> None:
    job = submit(runtime, tenant)
    lease = dispatch(runtime)
    with runtime.sessions.begin() as session:
        assert jobs_sql.request_cancel(session, job.id)
    assert load(runtime, job.id).status is Status.QUEUED

    assert execute(runtime, registry, job.id, lease.attempt, worker_id=WORKER) == "cancelled"

    done = load(runtime, job.id)
    assert (done.status, done.attempt, done.starts) == (Status.CANCELLED, 1, 0)
    assert done.started_at is None and probe.calls == []
    assert runtime.index.inflight() == 0 and runtime.index.entries_of([job.id]) == {}
    assert doorbell(runtime) == [b"1"]  # the freed slot is the dispatcher's to fill


def test_a_queued_row_past_its_start_by_ends_expired_unrun(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler
) -> None:
    job = submit(runtime, tenant, max_wait_s=60)
    assert job.start_by is not None
    lease = dispatch(runtime)
    assert lease.start_by == pytest.approx(job.start_by, abs=1e-3)
    late = job.start_by + 1.0

    outcome = execute(runtime, registry, job.id, lease.attempt, worker_id=WORKER,
                      clock=lambda: late)

    assert outcome == "expired"
    done = load(runtime, job.id)
    assert (done.status, done.starts, done.started_at) == (Status.EXPIRED, 0, None)
    assert probe.calls == []
    assert runtime.index.inflight() == 0 and runtime.index.entries_of([job.id]) == {}


# -- a row moved on: the message is stale --


def test_a_row_cancelled_at_the_messages_attempt_releases_its_lease(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler
) -> None:
    """The API's cancel committed, then stopped before it freed the lease in the index: the
    worker that gets the message frees it."""
    job = submit(runtime, tenant)
    lease = dispatch(runtime)
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(session, job.id, src=Status.QUEUED, attempt=1,
                                   dst=Status.CANCELLED, now=time.time())
    cancelled = load(runtime, job.id)
    assert runtime.index.inflight() == 1

    assert execute(runtime, registry, job.id, lease.attempt, worker_id=WORKER) == "stale"

    assert load(runtime, job.id) == cancelled and probe.calls == []
    assert runtime.index.inflight() == 0 and runtime.index.entries_of([job.id]) == {}
    assert runtime.index.tenant_inflight(tenant.id) == 0


@pytest.mark.parametrize("cancel_requested", [False, True], ids=["plain", "cancel-requested"])
def test_a_message_for_an_older_attempt_leaves_the_current_lease_alone(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler,
    cancel_requested: bool,
) -> None:
    """Nor does it settle the current attempt's row: a cancel asked of it is the business of
    the worker that gets attempt 2's message."""
    job = submit(runtime, tenant)
    dispatch(runtime)
    # Attempt 1 started, its lease was reaped and the job went back as attempt 2, which a
    # later round leased; attempt 1's message arrives only now (a redelivered copy).
    with runtime.sessions.begin() as session:
        assert jobs_sql.start(session, job.id, attempt=1, now=time.time()) is not None
    assert [r.job_id for r in runtime.index.reap(now=time.time() + 3600)] == [job.id]
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(session, job.id, src=Status.RUNNING, attempt=1,
                                   dst=Status.QUEUED, now=time.time())
    runtime.index.requeue(IndexedJob(job_id=job.id, tenant=tenant.id, tier=job.tier,
                                     order_key=job.order_key, attempt=2))
    assert dispatch(runtime).attempt == 2
    if cancel_requested:
        with runtime.sessions.begin() as session:
            assert jobs_sql.request_cancel(session, job.id)
    current = load(runtime, job.id)
    assert (current.status, current.attempt) == (Status.QUEUED, 2)

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "stale"

    assert load(runtime, job.id) == current and probe.calls == []
    assert runtime.index.entries_of([job.id]) == {
        job.id: Entry(job_id=job.id, attempt=2, leased=True)}
    assert runtime.index.tenant_inflight(tenant.id) == 1


# -- the slot a finished job frees goes straight to the next --


def test_a_success_hands_the_next_queued_job_over_and_rings_nobody_when_none_is_left(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler
) -> None:
    runtime.index.register_worker(WORKER, slots=1, ttl_s=600.0)  # the pool: one slot
    first, second = submit(runtime, tenant), submit(runtime, tenant)
    assert dispatch(runtime).job_id == first.id
    handed: list[Lease] = []

    hand = Handover(publish=lambda lease, _token: handed.append(lease))
    assert execute(runtime, registry, first.id, 1, worker_id=WORKER,
                   handover=hand) == "succeeded"

    assert [(lease.job_id, lease.attempt) for lease in handed] == [(second.id, 1)]
    assert runtime.index.entries_of([second.id]) == {
        second.id: Entry(job_id=second.id, attempt=1, leased=True)}
    assert load(runtime, second.id).status is Status.QUEUED
    assert doorbell(runtime) == []  # the slot went on: nothing for the dispatcher

    leased_at = handed[0].expires_at - LEASE_TTL_S
    more: list[Lease] = []
    assert execute(runtime, registry, second.id, handed[0].attempt, worker_id=WORKER,
                   dispatched_at=leased_at,
                   handover=Handover(publish=lambda lease, _token: more.append(lease))
                   ) == "succeeded"

    # An empty queue: nothing handed over, and nothing for the dispatcher either.
    assert more == []
    assert doorbell(runtime) == []
    assert runtime.index.inflight() == 0
    done = load(runtime, second.id)
    assert done.status is Status.SUCCEEDED
    assert done.dispatched_at == pytest.approx(leased_at, abs=1e-3)
    assert [call[0] for call in probe.calls] == [first.id, second.id]


def test_a_handover_that_raises_puts_the_next_lease_back(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler
) -> None:
    runtime.index.register_worker(WORKER, slots=1, ttl_s=600.0)
    first, second = submit(runtime, tenant), submit(runtime, tenant)
    assert dispatch(runtime).job_id == first.id
    offered: list[Lease] = []

    def broken_publish(lease: Lease, _token: str) -> None:
        offered.append(lease)
        raise ConnectionError("broker unreachable")

    assert execute(runtime, registry, first.id, 1, worker_id=WORKER,
                   handover=Handover(publish=broken_publish)) == "succeeded"

    assert [lease.job_id for lease in offered] == [second.id]
    assert runtime.index.entries_of([second.id]) == {
        second.id: Entry(job_id=second.id, attempt=1, leased=False)}
    assert runtime.index.inflight() == 0 and runtime.index.position(second.id) == 0
    assert doorbell(runtime) == [b"1"]
    assert load(runtime, first.id).status is Status.SUCCEEDED
    # Queued again at once, not held back: the next round leases it.
    again = dispatch(runtime, now=runtime.index.now())
    assert (again.job_id, again.attempt) == (second.id, 1)
    assert load(runtime, second.id).status is Status.QUEUED


# -- the start made ahead, while the next job's message travels --


def test_the_next_jobs_start_is_made_ahead_and_its_message_runs_it_once(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime.index.register_worker(WORKER, slots=1, ttl_s=600.0)
    first, second = submit(runtime, tenant), submit(runtime, tenant)
    assert dispatch(runtime).job_id == first.id
    handed: list[tuple[Lease, str]] = []
    hand = Handover(publish=lambda lease, token: handed.append((lease, token)), prestart=True)

    assert execute(runtime, registry, first.id, 1, worker_id=WORKER, handover=hand) == "succeeded"
    ((lease, token),) = handed  # handed to the consumer before the start was made
    assert lease.job_id == second.id
    assert load(runtime, second.id).status is Status.RUNNING  # the start made ahead
    assert [call[0] for call in probe.calls] == [first.id]  # started, not run: its message runs it

    assert execute(runtime, registry, second.id, 1, worker_id=WORKER, token=token) == "succeeded"
    # A copy of that message (the broker delivered it twice) finds the token taken.
    assert execute(runtime, registry, second.id, 1, worker_id=WORKER, token=token) == "stale"

    assert [call[0] for call in probe.calls] == [first.id, second.id]
    done = load(runtime, second.id)
    assert done.status is Status.SUCCEEDED and done.starts == 1 and done.attempt == 1
    assert runtime.index.inflight() == 0


class SpareThread:
    """A worker of one slot whose hand-over runs each message's task on a thread of its
    own at once, as the pool's spare thread does: two jobs queued, the first dispatched."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.probe = ProbeHandler(runtime)
        self.registry = HandlerRegistry([self.probe])
        runtime.index.register_worker(WORKER, slots=1, ttl_s=600.0)
        self.tenant = tenant = new_tenant(runtime)
        self.first, self.second = submit(runtime, tenant), submit(runtime, tenant)
        assert dispatch(runtime).job_id == self.first.id
        self.tasks: list[threading.Thread] = []
        self.outcomes: list[str] = []
        self.handover = Handover(publish=self._consume, prestart=True)
        self.chained = False  # each task hands its slot over in turn

    def _consume(self, lease: Lease, token: str) -> None:
        handover = self.handover if self.chained else None
        self.tasks.append(threading.Thread(target=lambda: self.outcomes.append(execute(
            self.runtime, self.registry, lease.job_id, lease.attempt, worker_id=WORKER,
            token=token, handover=handover))))
        self.tasks[-1].start()

    def await_second_handler(self) -> None:
        """Until the second job's handler has run (on its task's thread)."""
        deadline = time.monotonic() + 10
        while not self.probe.seen[1:]:
            assert time.monotonic() < deadline, "the second job's handler never ran"
            time.sleep(0.005)

    def run_first(self) -> str:
        """The first job's attempt, handing its slot over; then its next job's task, ended."""
        outcome = execute(self.runtime, self.registry, self.first.id, 1, worker_id=WORKER,
                          handover=self.handover)
        (task,) = self.tasks
        task.join(10)
        return outcome


@pytest.fixture
def held(pg_runtime: Runtime) -> Iterator[Callable[..., HeldCommit]]:
    made: list[HeldCommit] = []

    def hold(*, fail: bool = False) -> HeldCommit:
        """The first ending's COMMIT held (``fail``: lost)."""
        made.append(HeldCommit(pg_runtime.engine, event="UPDATE", table="jobs",
                               when="NEW.status = 'succeeded'", fail=fail, once=True))
        return made[-1]

    yield hold
    for one in made:
        one.close()


def test_a_next_job_run_before_the_endings_commit_ends_after_it_and_is_recorded(
    pg_runtime: Runtime, held: Callable[..., HeldCommit],
) -> None:
    """On PostgreSQL the next job's task runs as soon as the ending's statement has, while
    its COMMIT waits for the disk (here a slow one): that job's handler runs before the
    COMMIT, but its own ending waits for it and for the job's first renewal (announcing both
    moves, releasing the ending's lease), so a job that ends at once is recorded, not refused
    as stale by a snapshot taken before the COMMIT."""
    runtime = pg_runtime
    slot = SpareThread(runtime)
    held().let_go_when(slot.await_second_handler)  # it runs before this COMMIT
    announced = runtime.redis.pubsub(ignore_subscribe_messages=True)
    announced.subscribe(IndexKeys(runtime.settings.key_prefix).changed)
    announced.get_message(timeout=1.0)

    assert slot.run_first() == "succeeded"

    assert slot.outcomes == ["succeeded"]
    # The second job's handler read its row before the first's COMMIT: still queued.
    assert slot.probe.seen == [(Status.RUNNING, 1), (Status.QUEUED, 1)]
    first, second = slot.first, slot.second
    for job in (first, second):
        done = load(runtime, job.id)
        assert (done.status, done.attempt, done.starts) == (Status.SUCCEEDED, 1, 1)
    heard: set[str] = set()
    deadline = time.monotonic() + 5
    while {first.id, second.id} - heard and time.monotonic() < deadline:
        message = announced.get_message(timeout=0.5)
        if message is not None:
            heard.update(str(message["data"], "utf-8").split())
    announced.close()
    assert {first.id, second.id} <= heard
    assert runtime.index.inflight() == 0


def test_a_next_job_done_before_the_handing_commit_renews_itself_in_its_own_hand_over(
    pg_runtime: Runtime, monkeypatch: pytest.MonkeyPatch, held: Callable[..., HeldCommit],
) -> None:
    """The second job's handler is done while the first's COMMIT is still on its way (a slow
    one): its ending says first that it makes its own first renewal, and makes it in the
    round trip of its hand-over to the third job (releasing the first's lease, announcing
    its start, counting it), so the handing task makes none. Each job runs once and is
    recorded, each start is counted once, and no lease is left."""
    runtime = pg_runtime
    slot = SpareThread(runtime)
    slot.chained = True
    third = submit(runtime, slot.tenant)
    claimed = threading.Event()
    held().let_go_when(lambda: claimed.wait(10))
    claim = Landing.claim

    def claim_seen(landing: Landing) -> bool:
        mine = claim(landing)
        if mine:
            claimed.set()
        return mine

    monkeypatch.setattr(Landing, "claim", claim_seen)
    trips: list[int] = []

    def counted_trip(*calls: Any) -> Any:
        trips.append(len(calls))
        return one_trip(*calls)

    monkeypatch.setattr(redis_leases, "one_trip", counted_trip)

    assert execute(runtime, slot.registry, slot.first.id, 1, worker_id=WORKER,
                   handover=slot.handover) == "succeeded"
    deadline = time.monotonic() + 20
    while len(slot.outcomes) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    for task in slot.tasks:
        task.join(10)

    assert slot.outcomes == ["succeeded", "succeeded"]
    assert trips[:1] == [2]  # the second job's hand-over carried its first renewal
    assert [call[0] for call in slot.probe.calls] == [slot.first.id, slot.second.id, third.id]
    for job in (slot.first, slot.second, third):
        done = load(runtime, job.id)
        assert (done.status, done.attempt, done.starts) == (Status.SUCCEEDED, 1, 1)
    counts = runtime.redis.hgetall(IndexKeys(runtime.settings.key_prefix).prefix
                                   + "counters:jobs")
    assert counts[b"running"] == b"3" and counts[b"succeeded"] == b"3"
    assert runtime.index.inflight() == 0


def test_a_next_job_run_before_a_commit_that_fails_makes_its_lost_start_again_and_is_recorded(
    pg_runtime: Runtime, held: Callable[..., HeldCommit], caplog: pytest.LogCaptureFixture,
) -> None:
    """The ending's connection is lost at its COMMIT, after the next job's task was let run:
    the database rolls both moves back and the ending is recorded alone. The next job's
    handler has run; its ending, which waited for that COMMIT, finds its row queued at its
    attempt while it still holds the lease, so it makes the lost start again with the
    ending: the result in hand is recorded, the job runs once, one start is counted."""
    runtime = pg_runtime
    slot = SpareThread(runtime)
    # The session ends at the COMMIT, once the next job's task has run: rolled back.
    held(fail=True).let_go_when(slot.await_second_handler)

    assert slot.run_first() == "succeeded"

    assert slot.outcomes == ["succeeded"]
    first, second = slot.first, slot.second
    assert [call[0] for call in slot.probe.calls] == [first.id, second.id]
    assert slot.probe.seen[1] == (Status.QUEUED, 1)  # it ran before the COMMIT that failed
    made_again = [r for r in caplog.records if r.message == "job.start_made_again"]
    assert [getattr(r, "job_id", None) for r in made_again] == [second.id]
    assert load(runtime, first.id).status is Status.SUCCEEDED
    done = load(runtime, second.id)
    assert (done.status, done.attempt, done.starts) == (Status.SUCCEEDED, 1, 1)
    assert done.started_at is not None and done.finished_at is not None
    assert done.started_at <= done.finished_at
    assert runtime.index.inflight() == 0


def test_a_start_ahead_whose_commit_failed_before_its_task_took_it_is_made_by_that_task(
    pg_runtime: Runtime, held: Callable[..., HeldCommit],
) -> None:
    """The next job's task takes its start only after the handing COMMIT failed: it does
    not run the handler on the strength of a rolled-back row, but makes the start itself,
    under the same token, as any start; the job runs once and is recorded."""
    runtime = pg_runtime
    slot = SpareThread(runtime)
    messages: list[tuple[Lease, str]] = []
    slot.handover = Handover(publish=lambda lease, token: messages.append((lease, token)),
                             prestart=True)
    held(fail=True).let_go_when(lambda: None)  # the session ends at the COMMIT
    assert execute(runtime, slot.registry, slot.first.id, 1, worker_id=WORKER,
                   handover=slot.handover) == "succeeded"
    ((lease, token),) = messages
    assert load(runtime, slot.second.id).status is Status.QUEUED  # the start ahead was lost

    assert execute(runtime, slot.registry, lease.job_id, lease.attempt, worker_id=WORKER,
                   token=token) == "succeeded"

    second = slot.second
    assert [call[0] for call in slot.probe.calls] == [slot.first.id, second.id]
    assert slot.probe.seen[1] == (Status.RUNNING, 1)  # run after its own start
    done = load(runtime, second.id)
    assert (done.status, done.attempt, done.starts) == (Status.SUCCEEDED, 1, 1)
    assert runtime.index.inflight() == 0


def test_a_start_ahead_that_lands_after_its_message_gave_up_waiting_is_still_run_once(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, probe: ProbeHandler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The message's task owns its token: a start under it found in SQL is its own, even
    when the start ahead committed after the task stopped waiting for it."""
    job = submit(runtime, tenant)
    lease = dispatch(runtime)
    token = "ahead-token"
    PRE_STARTS.expect(token)
    monkeypatch.setattr(attempt_module, "PRESTART_WAIT_S", 0.0)  # gives up at once
    with runtime.sessions.begin() as session:  # the start ahead lands, its news late
        assert jobs_sql.start(session, job.id, attempt=lease.attempt, now=time.time(),
                              token=token) is not None

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER, token=token) == "succeeded"
    PRE_STARTS.settle(token, None)
    assert execute(runtime, registry, job.id, 1, worker_id=WORKER, token=token) == "stale"

    assert [call[0] for call in probe.calls] == [job.id]
    assert load(runtime, job.id).starts == 1
