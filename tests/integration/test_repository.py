"""The job repository on SQLite and PostgreSQL: tenants, inserts and idempotency, tenant
isolation, pagination, and every state change as a compare-and-set on (status, attempt)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from jobs.core.domain import Job, NewJob, Tenant
from jobs.core.errors import IllegalTransition, InvalidRequest
from jobs.core.ids import new_job_id
from jobs.core.states import NEW_ATTEMPT, TRANSITIONS, Status
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from jobs.store import tenants as tenants_sql
from jobs.store.engine import make_engine, make_sessionmaker

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0
Q, D, R = Status.QUEUED, Status.DISPATCHED, Status.RUNNING

# Moves out of ``waiting`` (batch items) start from rows only a batch makes: they are tried in
# tests/integration/test_batches.py.
LEGAL = sorted(move for move in TRANSITIONS if move[0] is not Status.WAITING)
ILLEGAL = [(src, dst) for src in Status for dst in Status if (src, dst) not in TRANSITIONS]


def _ids(pairs: list[tuple[Status, Status]]) -> list[str]:
    return [f"{src}->{dst}" for src, dst in pairs]


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: sa.Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


@pytest.fixture
def tenant(sessions: sessionmaker[Session]) -> Tenant:
    return _tenant(sessions, "acme")


def _tenant(sessions: sessionmaker[Session], name: str, tier: str = "free") -> Tenant:
    with sessions.begin() as session:
        return tenants_sql.create_tenant(
            session, name=name, tier=tier, api_key_hash=f"hash-{name}", now=T0
        )


def _new(tenant: Tenant, **overrides: Any) -> NewJob:
    fields: dict[str, Any] = {
        "tenant_id": tenant.id,
        "tier": tenant.tier,
        "kind": "echo",
        "payload": {"n": 1},
        "order_key": T0 + 120.0,
        "enqueued_at": T0,
    }
    return NewJob(**(fields | overrides))


def _insert(sessions: sessionmaker[Session], tenant: Tenant, **overrides: Any) -> Job:
    with sessions.begin() as session:
        return jobs_sql.insert_job(session, _new(tenant, **overrides))


def _get(sessions: sessionmaker[Session], job_id: str) -> Job:
    with sessions.begin() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None
    return job


def _move(sessions: sessionmaker[Session], job: Job, dst: Status, now: float = T0) -> Job:
    with sessions.begin() as session:
        assert jobs_sql.transition(
            session, job.id, src=job.status, attempt=job.attempt, dst=dst, now=now
        )
    return _get(sessions, job.id)


def _job_in(sessions: sessionmaker[Session], tenant: Tenant, status: Status, attempt: int) -> Job:
    """A job in ``status`` at ``attempt``, reached by legal moves only."""
    job = _insert(sessions, tenant)
    for _ in range(attempt - 1):
        job = _move(sessions, _move(sessions, job, D), Q)
    path = {Q: [], D: [D], R: [D, R]}[status]
    for dst in path:
        job = _move(sessions, job, dst)
    assert (job.status, job.attempt) == (status, attempt)
    return job


# -- tenants ---------------------------------------------------------------------------------


def test_tenant_create_read_update(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    assert tenant.name == "acme" and tenant.tier == "free" and tenant.created_at == T0
    assert tenant.cap is None and tenant.rate_per_s is None
    with sessions.begin() as session:
        assert tenants_sql.get_tenant(session, tenant.id) == tenant
        assert tenants_sql.tenant_by_name(session, "acme") == tenant
        assert tenants_sql.tenant_by_key_hash(session, "hash-acme") == tenant
        assert tenants_sql.tenant_by_key_hash(session, "nope") is None
        assert tenants_sql.get_tenant(session, "missing") is None
        updated = tenants_sql.update_tenant(
            session, tenant.id, tier="premium", api_key_hash="new", cap=2, rate_per_s=1.5
        )
    assert updated is not None
    assert (updated.tier, updated.api_key_hash, updated.cap, updated.rate_per_s) == (
        "premium", "new", 2, 1.5,
    )  # fmt: skip
    with sessions.begin() as session:
        assert tenants_sql.tenant_by_key_hash(session, "new") == updated
        assert tenants_sql.tenant_by_key_hash(session, "hash-acme") is None
        assert tenants_sql.update_tenant(session, "missing", tier="free") is None
        with pytest.raises(TypeError):
            tenants_sql.update_tenant(session, tenant.id, name="renamed")


def test_list_tenants(sessions: sessionmaker[Session]) -> None:
    for name in ("zeta", "alpha"):
        _tenant(sessions, name)
    with sessions.begin() as session:
        assert [t.name for t in tenants_sql.list_tenants(session)] == ["alpha", "zeta"]


def test_duplicate_tenant_name_is_invalid_and_transaction_survives(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    with sessions.begin() as session:
        with pytest.raises(InvalidRequest):
            tenants_sql.create_tenant(session, name="acme", tier="free", api_key_hash="other",
                                      now=T0)
        tenants_sql.create_tenant(session, name="beta", tier="free", api_key_hash="beta", now=T0)
    with sessions.begin() as session:
        assert [t.name for t in tenants_sql.list_tenants(session)] == ["acme", "beta"]


# -- jobs: insert, read, isolation -----------------------------------------------------------


def test_insert_and_get(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    job = _insert(sessions, tenant, max_wait_s=30.0, idempotency_key="k", payload={"a": [1]})
    assert job == _get(sessions, job.id)
    assert (job.status, job.attempt, job.max_attempts) == (Q, 1, 3)
    assert job.payload == {"a": [1]} and job.result is None and not job.cancel_requested
    assert job.created_at == job.enqueued_at == T0
    assert job.start_by == pytest.approx(T0 + 30.0)
    assert job.dispatched_at is job.started_at is job.finished_at is job.not_before is None


def test_another_tenants_job_is_invisible(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    other = _tenant(sessions, "other")
    job = _insert(sessions, tenant)
    with sessions.begin() as session:
        assert jobs_sql.get_job(session, job.id, tenant_id=other.id) is None
        assert jobs_sql.get_job(session, job.id, tenant_id=tenant.id) == job
        assert jobs_sql.list_jobs(session, tenant_id=other.id, limit=10) == ([], None)


def test_duplicate_idempotency_key(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    first = _insert(sessions, tenant, idempotency_key="once")
    other = _tenant(sessions, "other")
    with sessions.begin() as session:
        # A used key inserts nothing; the caller reads the job that holds it.
        assert jobs_sql.insert_job(session, _new(tenant, idempotency_key="once")) is None
        assert jobs_sql.job_by_idempotency_key(session, tenant.id, "once") == first
        # The outer transaction is still usable after the insert that did nothing.
        later = jobs_sql.insert_job(session, _new(tenant, idempotency_key="twice"))
        theirs = jobs_sql.insert_job(session, _new(other, idempotency_key="once"))
    with sessions.begin() as session:
        assert jobs_sql.job_by_idempotency_key(session, tenant.id, "once") == first
        assert jobs_sql.job_by_idempotency_key(session, tenant.id, "twice") == later
        assert jobs_sql.job_by_idempotency_key(session, other.id, "once") == theirs
        jobs, _ = jobs_sql.list_jobs(session, tenant_id=tenant.id, limit=10)
    assert {j.id for j in jobs} == {first.id, later.id}


def test_jobs_without_key_never_collide(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    a, b = _insert(sessions, tenant), _insert(sessions, tenant)
    assert a.id != b.id and a.idempotency_key is b.idempotency_key is None


def test_list_jobs_newest_first_with_cursor_and_status(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    made = [_insert(sessions, tenant, id=new_job_id(T0 + i)) for i in range(7)]
    for job in made[::2]:
        _move(sessions, job, D)
    newest_first = [j.id for j in reversed(made)]
    with sessions.begin() as session:
        seen, cursor, pages = [], None, 0
        while True:
            page, cursor = jobs_sql.list_jobs(session, tenant_id=tenant.id, limit=3, cursor=cursor)
            seen += [j.id for j in page]
            pages += 1
            if cursor is None:
                break
        assert (seen, pages) == (newest_first, 3)
        page, cursor = jobs_sql.list_jobs(session, tenant_id=tenant.id, status=D, limit=3)
        assert [j.id for j in page] == [made[6].id, made[4].id, made[2].id]
        page, cursor = jobs_sql.list_jobs(session, tenant_id=tenant.id, status=D, cursor=cursor)
        assert ([j.id for j in page], cursor) == ([made[0].id], None)
        assert all(j.status is D for j in page)


@pytest.mark.parametrize("cursor", ["not-a-cursor", "", "!!!!", "bm90LWEtdXVpZA"])
def test_list_jobs_rejects_a_bad_cursor(
    sessions: sessionmaker[Session], tenant: Tenant, cursor: str
) -> None:
    with sessions.begin() as session, pytest.raises(InvalidRequest):
        jobs_sql.list_jobs(session, tenant_id=tenant.id, limit=10, cursor=cursor)


def test_list_jobs_rejects_a_zero_limit(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    with sessions.begin() as session, pytest.raises(InvalidRequest):
        jobs_sql.list_jobs(session, tenant_id=tenant.id, limit=0)


# -- transitions -----------------------------------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), LEGAL, ids=_ids(LEGAL))
def test_legal_transition_from_the_right_state(
    sessions: sessionmaker[Session], tenant: Tenant, src: Status, dst: Status
) -> None:
    job = _job_in(sessions, tenant, src, attempt=2)
    moved = _move(sessions, job, dst, now=T0 + 50.0)
    assert moved.status is dst
    assert moved.attempt == (3 if (src, dst) in NEW_ATTEMPT else 2)
    assert moved.enqueued_at == job.enqueued_at and moved.order_key == job.order_key
    if dst is D:
        assert moved.dispatched_at == T0 + 50.0
    if dst is R:
        assert moved.started_at == T0 + 50.0 and moved.dispatched_at == job.dispatched_at
    if dst.terminal:
        assert moved.finished_at == T0 + 50.0
    else:
        assert moved.finished_at is None
    if (src, dst) in NEW_ATTEMPT:
        # A new attempt; a job that ran keeps its started_at (the client can tell).
        assert moved.dispatched_at is None and moved.started_at == job.started_at


@pytest.mark.parametrize(("src", "dst"), LEGAL, ids=_ids(LEGAL))
def test_legal_transition_fails_from_a_wrong_status(
    sessions: sessionmaker[Session], tenant: Tenant, src: Status, dst: Status
) -> None:
    job = _job_in(sessions, tenant, D if src is Q else Q, attempt=1)
    with sessions.begin() as session:
        assert not jobs_sql.transition(session, job.id, src=src, attempt=1, dst=dst, now=T0 + 9)
    assert _get(sessions, job.id) == job


@pytest.mark.parametrize(("src", "dst"), LEGAL, ids=_ids(LEGAL))
def test_legal_transition_fails_with_a_stale_attempt(
    sessions: sessionmaker[Session], tenant: Tenant, src: Status, dst: Status
) -> None:
    job = _job_in(sessions, tenant, src, attempt=2)
    with sessions.begin() as session:
        for stale in (1, 3):
            assert not jobs_sql.transition(session, job.id, src=src, attempt=stale, dst=dst, now=T0)
        assert not jobs_sql.transition(session, "no-such-job", src=src, attempt=2, dst=dst, now=T0)
    assert _get(sessions, job.id) == job


@pytest.mark.parametrize(("src", "dst"), ILLEGAL, ids=_ids(ILLEGAL))
def test_illegal_transition_raises_before_any_sql(
    engine: sa.Engine, sessions: sessionmaker[Session], tenant: Tenant, src: Status, dst: Status
) -> None:
    job = _insert(sessions, tenant)
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        with sessions.begin() as session, pytest.raises(IllegalTransition):
            jobs_sql.transition(session, job.id, src=src, attempt=1, dst=dst, now=T0)
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    assert not [s for s in statements if "jobs" in s]
    assert _get(sessions, job.id) == job


def test_transition_fields(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    job = _job_in(sessions, tenant, R, attempt=1)
    with sessions.begin() as session:
        with pytest.raises(TypeError):
            jobs_sql.transition(session, job.id, src=R, attempt=1, dst=Q, now=T0, status="x")
        assert jobs_sql.transition(
            session, job.id, src=R, attempt=1, dst=Q, now=T0 + 5, error="boom", not_before=T0 + 9
        )
    retried = _get(sessions, job.id)
    assert (retried.status, retried.attempt, retried.error) == (Q, 2, "boom")
    assert retried.not_before == T0 + 9
    retried = _move(sessions, _move(sessions, retried, D), R)
    with sessions.begin() as session:
        result = {"out": [1, 2, {"x": None}]}
        assert jobs_sql.transition(
            session, job.id, src=R, attempt=2, dst=Status.SUCCEEDED, now=T0 + 20, result=result
        )
    done = _get(sessions, job.id)
    assert (done.status, done.result, done.finished_at) == (Status.SUCCEEDED, result, T0 + 20)


def test_claim_takes_queued_jobs_in_time_in_one_statement(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    fresh = _insert(sessions, tenant)
    second = _job_in(sessions, tenant, Q, attempt=2)  # claimed at the attempt its row holds
    late = _insert(sessions, tenant, max_wait_s=5.0)  # start_by = T0 + 5
    running = _job_in(sessions, tenant, R, attempt=1)
    statements: list[str] = []
    engine = sessions.kw["bind"]
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with sessions.begin() as session:
        claimed = jobs_sql.claim(
            session, [fresh.id, second.id, late.id, running.id, "no-such-job"], now=T0 + 5
        )
    assert sorted(claimed) == sorted([fresh.id, second.id])
    assert claimed[second.id].attempt == 2 and claimed[fresh.id].attempt == 1
    assert claimed[fresh.id].tier == fresh.tier and claimed[fresh.id].order_key == fresh.order_key
    assert len([s for s in statements if s.lstrip().upper().startswith("UPDATE")]) == 1
    assert (_get(sessions, fresh.id).status, _get(sessions, fresh.id).dispatched_at) == (D, T0 + 5)
    assert _get(sessions, late.id).status is Q  # past start_by: left for the caller
    assert _get(sessions, running.id).status is R


def test_start_moves_this_attempt_to_running_and_returns_the_row(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    job = _move(sessions, _insert(sessions, tenant, max_wait_s=10.0), D)
    with sessions.begin() as session:
        assert jobs_sql.start(session, job.id, attempt=2, now=T0 + 1) is None  # another attempt
        started = jobs_sql.start(session, job.id, attempt=1, now=T0 + 1)
    assert started is not None
    assert (started.status, started.starts, started.started_at) == (R, 1, T0 + 1)
    assert started.payload == job.payload
    with sessions.begin() as session:
        assert jobs_sql.start(session, job.id, attempt=1, now=T0 + 2) is None  # not dispatched


@pytest.mark.parametrize("why", ["cancel", "late"])
def test_start_refuses_a_job_that_must_not_compute(
    sessions: sessionmaker[Session], tenant: Tenant, why: str
) -> None:
    job = _move(sessions, _insert(sessions, tenant, max_wait_s=10.0), D)
    now = T0 + 1
    if why == "cancel":
        with sessions.begin() as session:
            assert jobs_sql.request_cancel(session, job.id)
    else:
        now = T0 + 10  # start_by reached
    with sessions.begin() as session:
        assert jobs_sql.start(session, job.id, attempt=1, now=now) is None
    assert _get(sessions, job.id).status is D


def test_request_cancel(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    running = _job_in(sessions, tenant, R, attempt=1)
    finished = _move(sessions, _job_in(sessions, tenant, R, attempt=1), Status.SUCCEEDED)
    with sessions.begin() as session:
        assert jobs_sql.request_cancel(session, running.id)
        assert jobs_sql.request_cancel(session, running.id)  # asking twice is harmless
        assert not jobs_sql.request_cancel(session, finished.id)
        assert not jobs_sql.request_cancel(session, "no-such-job")
    assert _get(sessions, running.id).cancel_requested
    assert not _get(sessions, finished.id).cancel_requested


def test_concurrent_cas_has_one_winner(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    """The first session holds its uncommitted update; the second waits for it, then loses."""
    job = _insert(sessions, tenant)
    outcome: list[bool] = []

    def second() -> None:
        with sessions.begin() as session:
            outcome.append(jobs_sql.transition(session, job.id, src=Q, attempt=1, dst=D,
                                               now=T0 + 2))

    with sessions.begin() as session:
        assert jobs_sql.transition(session, job.id, src=Q, attempt=1, dst=D, now=T0 + 1)
        thread = threading.Thread(target=second)
        thread.start()
        thread.join(0.3)
        assert thread.is_alive()  # blocked on the first session's row (or write) lock
    thread.join(10)
    assert outcome == [False]
    assert _get(sessions, job.id).dispatched_at == T0 + 1


def test_many_racers_one_winner(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    job = _insert(sessions, tenant)
    racers = 8
    barrier = threading.Barrier(racers)
    outcome: list[bool] = []

    def race(i: int) -> None:
        barrier.wait(5)
        with sessions.begin() as session:
            won = jobs_sql.transition(session, job.id, src=Q, attempt=1, dst=D, now=T0 + i)
        outcome.append(won)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(outcome) == [False] * (racers - 1) + [True]
    assert _get(sessions, job.id).status is D


# -- bulk reads ------------------------------------------------------------------------------


def test_jobs_in_status_and_counts(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    late = _insert(sessions, tenant, order_key=T0 + 500)
    early = _insert(sessions, tenant, order_key=T0 + 10)
    tie = _insert(sessions, tenant, order_key=T0 + 10, id=new_job_id(T0 + 99))
    flying = _move(sessions, _insert(sessions, tenant, order_key=T0 + 1), D)
    _move(sessions, _insert(sessions, tenant), Status.CANCELLED)
    with sessions.begin() as session:
        queued = jobs_sql.jobs_in_status(session, [Q])
        live = jobs_sql.jobs_in_status(session, [Q, D, R])
        counts = stats_sql.count_by_status(session)
    assert [j.id for j in queued] == [*sorted([early.id, tie.id]), late.id]
    assert live[0].id == flying.id and len(live) == 4
    assert counts == dict.fromkeys(Status, 0) | {Q: 3, D: 1, Status.CANCELLED: 1}


def test_recent_service_times_and_waits(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    premium = _tenant(sessions, "rich", tier="premium")
    for i, (dst, run_s) in enumerate([(Status.SUCCEEDED, 4.0), (Status.FAILED, 2.0)]):
        job = _move(sessions, _insert(sessions, tenant), D, now=T0 + 1)
        job = _move(sessions, job, R, now=T0 + 10 + i)
        _move(sessions, job, dst, now=T0 + 10 + i + run_s)
    _move(sessions, _move(sessions, _insert(sessions, tenant), D), Status.FAILED)  # never ran
    _move(sessions, _move(sessions, _insert(sessions, premium), D), R, now=T0 + 30)
    with sessions.begin() as session:
        assert stats_sql.recent_service_times(session, limit=10) == pytest.approx([4.0, 2.0])
        assert stats_sql.recent_service_times(session, limit=1) == pytest.approx([4.0])
        assert stats_sql.recent_waits(session, tier="free", since=T0) == pytest.approx([10.0, 11.0])
        waits = stats_sql.recent_waits(session, tier="free", since=T0 + 10.5)
        assert waits == pytest.approx([11.0])
        assert stats_sql.recent_waits(session, tier="premium", since=T0) == pytest.approx([30.0])


# -- the seam: foreign keys and times ------------------------------------------


def test_job_of_unknown_tenant_is_refused(sessions: sessionmaker[Session], tenant: Tenant) -> None:
    with sessions.begin() as session, pytest.raises(sa.exc.IntegrityError):
        jobs_sql.insert_job(session, _new(tenant, tenant_id="no-such-tenant"))


def test_times_round_trip_to_the_microsecond(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    job = _insert(sessions, tenant, enqueued_at=T0 + 0.123456, max_wait_s=0.5)
    stored = _get(sessions, job.id)
    assert stored.enqueued_at == pytest.approx(T0 + 0.123456, abs=1e-6)
    assert stored.start_by == pytest.approx(T0 + 0.623456, abs=1e-6)
