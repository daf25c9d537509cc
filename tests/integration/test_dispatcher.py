"""The dispatcher's rounds against real SQL and a real Redis index, driven by ``run_once``.

The publisher is the one seam replaced here (a recorder): publishing through Celery to real
workers is covered end to end in tests/e2e. A dispatch writes nothing to SQL (the lease is the
claim), so what a lease meets in its row (cancelled, past its deadline, not committed yet) is
settled by the worker's start: where that matters, a recorded message is handed to
``execute`` as the worker's task would, on the round's clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis

from jobs.core.cadence import PUBLISH_RETRY_S, UNCOMMITTED_GRACE_S, UNCOMMITTED_RETRY_S
from jobs.core.domain import Job, NewJob
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.dispatch.rebuild import indexed
from jobs.execution.attempt import execute
from jobs.execution.registry import HandlerRegistry
from jobs.index.base import IndexedJob
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.direct import direct_pool
from jobs.store.engine import make_engine, make_sessionmaker
from tests.handlers_for_tests import RecordingHandler
from tests.integration.stand_in import STAND_IN, stand_ins_for

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


T0 = 1_800_000_000.0
WORKER = "worker-test@host"

Message = tuple[str, int, str]


@dataclass
class RecordingPublisher:
    sent: list[Message] = field(default_factory=list)
    fail: bool = False
    # The kind's queue each job went to instead of its tier's (a pool routed by kind).
    kinds: dict[str, str] = field(default_factory=dict)

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None,
        kind: str | None = None,
    ) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append((job_id, attempt, tier))
        if kind is not None:
            self.kinds[job_id] = kind


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(
        database_url=db_url,
        key_prefix=key_prefix,
        policy={"pool_concurrency": 2, "lease_ttl_s": 10, "max_attempts": 2},
    )
    engine = make_engine(db_url)
    rt = Runtime(
        settings=settings,
        policy=settings.build_policy(),
        engine=engine,
        sessions=make_sessionmaker(engine),
        redis=redis_client,
        index=RedisIndex(redis_client, key_prefix),
        direct=direct_pool(engine, size=4),
    )
    yield rt
    if rt.direct is not None:
        rt.direct.close()
    engine.dispose()


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def dispatcher(runtime: Runtime, publisher: RecordingPublisher) -> Dispatcher:
    return Dispatcher(runtime, publisher)


@pytest.fixture
def handler() -> RecordingHandler:
    return RecordingHandler()


@pytest.fixture
def registry(handler: RecordingHandler) -> HandlerRegistry:
    return HandlerRegistry([handler])


def work(runtime: Runtime, registry: HandlerRegistry, message: Message, *, at: float) -> str:
    """A worker's handling of one published message, its clock at ``at``."""
    job_id, attempt, _tier = message
    return execute(runtime, registry, job_id, attempt, worker_id=WORKER, clock=lambda: at)


def tenant(runtime: Runtime, name: str, tier: str = "standard", cap: int | None = None) -> str:
    with runtime.sessions.begin() as s:
        t = tenants_sql.create_tenant(s, name=name, tier=tier, api_key_hash=name, now=T0)
        if cap is not None:
            tenants_sql.update_tenant(s, t.id, cap=cap)
        return t.id


def queue_job(
    runtime: Runtime,
    tenant_id: str,
    *,
    at: float,
    tier: str = "standard",
    max_wait_s: float | None = None,
    kind: str = "echo",
) -> Job:
    new = NewJob(
        id=new_job_id(at),
        tenant_id=tenant_id,
        tier=tier,
        kind=kind,
        payload={},
        order_key=runtime.policy.order_key(tier, at),
        enqueued_at=at,
        max_wait_s=max_wait_s,
        max_attempts=2,
    )
    with runtime.sessions.begin() as s:
        job = jobs_sql.insert_job(s, new)
    admitted = runtime.index.admit(indexed(job), bound=1000)
    assert admitted.accepted
    return job


def status(runtime: Runtime, job_id: str) -> Job:
    with runtime.sessions() as s:
        job = jobs_sql.get_job(s, job_id)
    assert job is not None
    return job


def test_publishes_as_many_jobs_as_free_slots_in_order(
    runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher
) -> None:
    tenants = [tenant(runtime, f"t{i}") for i in range(3)]
    jobs = [queue_job(runtime, tenants[i % 3], at=T0 + i) for i in range(5)]

    stats = dispatcher.run_once(T0 + 10)

    assert stats.dispatched == 2
    assert publisher.sent == [(jobs[0].id, 1, "standard"), (jobs[1].id, 1, "standard")]
    # The leases are the claim: nothing is written to SQL until a worker starts the job.
    assert runtime.index.inflight() == 2
    leased = runtime.index.entries_of([job.id for job in jobs])
    assert {job_id for job_id, entry in leased.items() if entry.leased} == {
        jobs[0].id, jobs[1].id}
    assert all(status(runtime, job.id).status is Status.QUEUED for job in jobs)
    assert dispatcher.run_once(T0 + 11).dispatched == 0  # the pool is full: nothing more
    runtime.index.release(jobs[0].id)
    assert dispatcher.run_once(T0 + 12).dispatched == 1
    assert publisher.sent[-1][0] == jobs[2].id


def test_a_tenant_at_its_cap_waits_while_others_go_first(
    runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher
) -> None:
    noisy = tenant(runtime, "noisy", cap=1)
    quiet = tenant(runtime, "quiet")
    noisy_jobs = [queue_job(runtime, noisy, at=T0 + i) for i in range(3)]
    quiet_job = queue_job(runtime, quiet, at=T0 + 5)

    dispatcher.run_once(T0 + 10)

    assert [s[0] for s in publisher.sent] == [noisy_jobs[0].id, quiet_job.id]
    runtime.index.release(noisy_jobs[0].id)
    dispatcher.run_once(T0 + 11)
    assert publisher.sent[-1][0] == noisy_jobs[1].id  # it kept its place


def test_a_lowered_cap_holds_within_the_promised_five_seconds(
    runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher
) -> None:
    """docs/api.md: a change of a tenant takes effect everywhere within 5 s."""
    acme = tenant(runtime, "acme", tier="premium", cap=2)
    dispatcher.run_once(T0)  # the leader knows the cap of 2
    with runtime.sessions.begin() as s:
        tenants_sql.update_tenant(s, acme, cap=1)
    dispatcher.run_once(T0 + 2)  # the leader's upkeep, a period later
    for i in range(2):
        queue_job(runtime, acme, at=T0 + 3 + i / 10, tier="premium")

    dispatcher.run_once(T0 + 4)  # 4 s after the change

    assert len(publisher.sent) == 1
    assert runtime.index.inflight() == 1


def test_cancelled_or_expired_jobs_are_never_run(
    runtime: Runtime,
    dispatcher: Dispatcher,
    publisher: RecordingPublisher,
    registry: HandlerRegistry,
    handler: RecordingHandler,
) -> None:
    """A job waiting past its deadline is expired by the round, never offered. A dispatch
    reads no row, so a cancelled job whose entry is still indexed, or one whose deadline
    passes while its message waits, is published: the worker's start ends it without
    running its handler, and frees its slot."""
    t1, t2, t3 = (tenant(runtime, n) for n in ("a", "b", "c"))
    cancelled = queue_job(runtime, t1, at=T0, kind="record")
    with runtime.sessions.begin() as s:  # the API cancelled it in SQL; the index still has it
        jobs_sql.transition(
            s, cancelled.id, src=Status.QUEUED, attempt=1, dst=Status.CANCELLED, now=T0
        )
    waits = queue_job(runtime, t2, at=T0 + 0.5, max_wait_s=7, kind="record")  # to T0 + 7.5
    late = queue_job(runtime, t3, at=T0 + 1, max_wait_s=5, kind="record")  # until T0 + 6

    stats = dispatcher.run_once(T0 + 6.5)

    assert stats.expired == 1
    assert status(runtime, late.id).status is Status.EXPIRED
    assert publisher.sent == [(cancelled.id, 1, "standard"), (waits.id, 1, "standard")]
    outcomes = [work(runtime, registry, message, at=T0 + 8) for message in publisher.sent]

    assert outcomes == ["stale", "expired"]
    assert handler.calls == []
    assert status(runtime, cancelled.id).status is Status.CANCELLED
    assert status(runtime, waits.id).status is Status.EXPIRED
    assert status(runtime, waits.id).starts == 0
    assert runtime.index.inflight() == 0  # no slot leaked
    assert runtime.index.entries_of([cancelled.id, waits.id, late.id]) == {}


def test_waiting_jobs_expire_even_while_the_pool_is_full(
    runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher
) -> None:
    t1, t2, t3 = (tenant(runtime, n) for n in ("a", "b", "c"))
    queue_job(runtime, t1, at=T0)
    queue_job(runtime, t2, at=T0)
    assert dispatcher.run_once(T0 + 1).dispatched == 2
    waiting = queue_job(runtime, t3, at=T0 + 1, max_wait_s=2)

    stats = dispatcher.run_once(T0 + 3.5)

    assert stats.expired == 1
    assert status(runtime, waiting.id).status is Status.EXPIRED
    assert runtime.index.position(waiting.id) is None


def test_an_expired_lease_requeues_with_the_next_attempt_and_the_same_key(
    runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher
) -> None:
    """Its worker started it, then died: the start is spent, one is left."""
    t = tenant(runtime, "acme")
    job = queue_job(runtime, t, at=T0)
    dispatcher.run_once(T0 + 1)
    with runtime.sessions.begin() as s:  # the worker's start, then it dies
        assert jobs_sql.start(s, job.id, attempt=1, now=T0 + 1) is not None

    stats = dispatcher.run_once(T0 + 1 + runtime.policy.lease_ttl_s + 1)  # nobody renewed it

    assert stats.reaped == 1 and stats.requeued == 1
    assert publisher.sent == [(job.id, 1, "standard"), (job.id, 2, "standard")]
    again = status(runtime, job.id)
    assert again.status is Status.QUEUED  # offered again; its next start moves it
    assert again.attempt == 2 and again.starts == 1
    assert again.order_key == job.order_key
    assert again.enqueued_at == job.enqueued_at


def test_a_lapsed_lease_of_a_job_never_started_is_offered_again_as_it_was(
    runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher
) -> None:
    """Its message was lost (or no worker took it): the row is still queued, so the reaper
    indexes it again as it is, the same attempt, nothing charged."""
    t = tenant(runtime, "acme")
    job = queue_job(runtime, t, at=T0)
    dispatcher.run_once(T0 + 1)

    stats = dispatcher.run_once(T0 + 1 + runtime.policy.lease_ttl_s + 1)

    assert stats.reaped == 1 and stats.requeued == 0
    assert publisher.sent == [(job.id, 1, "standard"), (job.id, 1, "standard")]
    again = status(runtime, job.id)
    assert again.status is Status.QUEUED
    assert again.attempt == 1 and again.starts == 0
    assert runtime.index.inflight() == 1


def test_a_job_whose_attempts_are_spent_fails_when_its_lease_expires(
    runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher
) -> None:
    """Its worker dies after each start (max_attempts = 2 counts starts)."""
    t = tenant(runtime, "acme")
    job = queue_job(runtime, t, at=T0)
    now = T0
    for attempt in (1, 2):
        now += 1
        dispatcher.run_once(now)
        with runtime.sessions.begin() as s:  # the worker starts it, then dies
            assert jobs_sql.start(s, job.id, attempt=attempt, now=now) is not None
        now += runtime.policy.lease_ttl_s + 1
        stats = dispatcher.run_once(now)

    final = status(runtime, job.id)
    assert final.status is Status.FAILED and final.starts == 2
    assert "stopped renewing its lease (start 2 of 2)" in (final.error or "")
    assert stats.failed == 1
    assert runtime.index.inflight() == 0


def test_an_uncommitted_job_is_retried_then_dropped(
    runtime: Runtime,
    dispatcher: Dispatcher,
    publisher: RecordingPublisher,
    registry: HandlerRegistry,
) -> None:
    """The worker's start finds no row: while the submit's commit may be on its way, the
    job goes back to the queue and is offered again shortly; past that grace, it is a failed
    submit's leftover, dropped."""
    t = tenant(runtime, "acme")
    ghost = IndexedJob(job_id=new_job_id(T0), tenant=t, tier="standard", order_key=T0)
    runtime.index.admit(ghost, bound=10)

    dispatcher.run_once(T0 + 1)
    assert publisher.sent == [(ghost.job_id, 1, "standard")]
    assert work(runtime, registry, publisher.sent[-1], at=T0 + 1) == "stale"
    assert runtime.index.tenant_queued(t) == 1  # its SQL row may still be committing
    assert runtime.index.inflight() == 0
    assert dispatcher.run_once(T0 + 1, maintain=False).dispatched == 0  # not at once
    retry_at = T0 + 1 + UNCOMMITTED_RETRY_S
    assert dispatcher.run_once(retry_at, maintain=False).dispatched == 1  # but soon
    assert publisher.sent[-1] == (ghost.job_id, 1, "standard")
    assert work(runtime, registry, publisher.sent[-1], at=retry_at) == "stale"
    assert runtime.index.tenant_queued(t) == 1

    late = T0 + UNCOMMITTED_GRACE_S + 1
    assert dispatcher.run_once(late, maintain=False).dispatched == 1
    assert work(runtime, registry, publisher.sent[-1], at=late) == "stale"
    assert runtime.index.tenant_queued(t) == 0  # a failed submit's leftover: dropped
    assert runtime.index.inflight() == 0
    assert runtime.index.entries_of([ghost.job_id]) == {}


def test_a_job_popped_before_its_row_commits_keeps_its_deadline(
    runtime: Runtime,
    dispatcher: Dispatcher,
    publisher: RecordingPublisher,
    registry: HandlerRegistry,
) -> None:
    """A submit indexes its job, then commits the row: a job dispatched in between finds no
    row at its worker's start, and goes back to the queue from its lease. It keeps its
    deadline there, and expires on time while the pool is full, as a peer with the same
    deadline does."""
    racer, a, b, c = (tenant(runtime, n) for n in ("racer", "a", "b", "c"))
    new = NewJob(id=new_job_id(T0), tenant_id=racer, tier="standard", kind="echo",
                 payload={}, order_key=runtime.policy.order_key("standard", T0),
                 enqueued_at=T0, max_wait_s=3, max_attempts=2)
    assert runtime.index.admit(IndexedJob(
        job_id=new.id, tenant=racer, tier="standard", order_key=new.order_key,
        start_by=new.start_by), bound=1000).accepted
    first, second = queue_job(runtime, a, at=T0 + 0.1), queue_job(runtime, b, at=T0 + 0.2)
    peer = queue_job(runtime, c, at=T0 + 0.3, max_wait_s=2.7)  # the same start_by

    dispatcher.run_once(T0 + 1)  # the racer and the first
    assert [sent[0] for sent in publisher.sent] == [new.id, first.id]
    assert work(runtime, registry, publisher.sent[0], at=T0 + 1) == "stale"  # no row yet
    dispatcher.run_once(T0 + 1, maintain=False)  # the second fills the freed slot
    assert [sent[0] for sent in publisher.sent] == [new.id, first.id, second.id]
    with runtime.sessions.begin() as s:  # the submit's INSERT commits
        jobs_sql.insert_job(s, new)

    stats = dispatcher.run_once(T0 + 3.5)

    assert stats.dispatched == 0  # the pool is full
    assert stats.expired == 2
    assert status(runtime, peer.id).status is Status.EXPIRED
    assert status(runtime, new.id).status is Status.EXPIRED
    assert runtime.index.entries_of([new.id]) == {}


def test_a_failed_publish_hands_the_jobs_back_without_charging_an_attempt(
    runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher
) -> None:
    dispatcher.run_once(T0)  # the leader's first round (its full pass) is behind it
    t1, t2 = tenant(runtime, "acme"), tenant(runtime, "other")
    first, second = queue_job(runtime, t1, at=T0), queue_job(runtime, t2, at=T0 + 1)
    publisher.fail = True

    stats = dispatcher.run_once(T0 + 2)

    assert stats.dispatched == 0 and stats.publish_failed == 2
    assert runtime.index.inflight() == 0  # the slots are free again at once
    entries = runtime.index.entries_of([first.id, second.id])
    assert {job_id: (entry.attempt, entry.leased) for job_id, entry in entries.items()} == {
        first.id: (1, False), second.id: (1, False)}  # back in the queue, the same attempt
    for job in (first, second):
        back = status(runtime, job.id)  # a dispatch writes nothing to SQL
        assert back.status is Status.QUEUED
        assert back.attempt == 1 and back.starts == 0  # not charged
        assert back.max_attempts == 2
        assert back.order_key == job.order_key
    backing_off = dispatcher.run_once(T0 + 2 + PUBLISH_RETRY_S / 2)
    assert backing_off.dispatched == 0 and backing_off.publish_failed == 0  # not offered yet

    publisher.fail = False
    assert dispatcher.run_once(T0 + 2 + PUBLISH_RETRY_S).dispatched == 2
    assert publisher.sent == [(first.id, 1, "standard"), (second.id, 1, "standard")]


def test_a_pool_routed_by_kind_sends_each_job_to_workers_of_its_kind_or_parks_it(
    runtime: Runtime, dispatcher: Dispatcher, publisher: RecordingPublisher
) -> None:
    """Workers of different kinds (``jobs.dispatch.routing``): a kind every live worker runs
    goes to its tier's queue, one only some run to its own queue, one none runs is parked in
    its place, uncharged, until the leader sees a worker of it register."""
    runtime.index.unregister_worker(STAND_IN)
    runtime.index.register_worker("a@host", slots=1, ttl_s=1e9, now=T0, kinds=["echo", "upper"])
    runtime.index.register_worker("b@host", slots=1, ttl_s=1e9, now=T0, kinds=["echo"])
    upper = queue_job(runtime, tenant(runtime, "t1"), at=T0, kind="upper")
    echo = queue_job(runtime, tenant(runtime, "t2"), at=T0 + 1)
    gone = queue_job(runtime, tenant(runtime, "t3"), at=T0 + 2, kind="gone.kind")

    dispatcher.run_once(T0 + 10)
    assert publisher.sent == [(upper.id, 1, "standard"), (echo.id, 1, "standard")]
    assert publisher.kinds == {upper.id: "upper"}  # the echo to its tier's queue
    runtime.index.release(upper.id)
    runtime.index.release(echo.id)
    stats = dispatcher.run_once(T0 + 11)
    assert stats.parked == 1 and len(publisher.sent) == 2  # none runs it: it waits, parked
    assert runtime.index.kinds_waiting() == {"gone.kind"}
    assert runtime.index.inflight() == 0 and status(runtime, gone.id).status is Status.QUEUED

    runtime.index.register_worker("c@host", slots=1, ttl_s=1e9, now=T0, kinds=["gone.kind"])
    dispatcher.run_once(T0 + 12)  # the leader's upkeep: back in its place, and dispatched
    assert publisher.sent[2:] == [(gone.id, 1, "standard")]
    assert publisher.kinds[gone.id] == "gone.kind"
    assert status(runtime, gone.id).starts == 0
