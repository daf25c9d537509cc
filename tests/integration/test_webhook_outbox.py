"""The webhook outbox on SQLite and PostgreSQL: the trigger of migration 0013 records each
event a subscription names in the transaction of the change (on every path a job moves by:
a move, a worker's start, an ending with the next start in one statement, a batch's
items), the deliverers' claim lets one of them win each event, a try leaves it delivered,
due again or given up, and the tenants' secrets are made once and rotated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from jobs.core.domain import Job, NewJob, Tenant
from jobs.core.states import Status
from jobs.core.webhooks import Webhook
from jobs.store import batches as batches_sql
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store import webhooks as repo
from jobs.store.batches import Batch
from jobs.store.engine import make_engine, make_sessionmaker
from jobs.store.rows import dt

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0
URL = "https://receiver.example/hook"
Q, R = Status.QUEUED, Status.RUNNING


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def tenant(sessions: sessionmaker[Session]) -> Tenant:
    with sessions.begin() as session:
        return tenants_sql.create_tenant(session, name="acme", tier="free",
                                         api_key_hash="hash-acme", now=T0)


def _insert(sessions: sessionmaker[Session], tenant: Tenant, events: tuple[str, ...] | None
            ) -> Job:
    hook = None if events is None else Webhook(url=URL, events=events)
    with sessions.begin() as session:
        return jobs_sql.insert_job(session, NewJob(
            tenant_id=tenant.id, tier=tenant.tier, kind="echo", payload={}, order_key=T0,
            enqueued_at=T0, webhook_url=None if hook is None else hook.url,
            webhook_events=None if hook is None else hook.column))


def _move(sessions: sessionmaker[Session], job: Job, dst: Status, now: float) -> Job:
    with sessions.begin() as session:
        assert jobs_sql.transition(session, job.id, src=job.status, attempt=job.attempt,
                                   dst=dst, now=now)
        found = jobs_sql.get_job(session, job.id)
    assert found is not None
    return found


def _events(sessions: sessionmaker[Session]) -> list[tuple[str, str | None, str | None, float]]:
    with sessions() as session:
        rows = session.execute(sa.select(repo.EVENTS).order_by(repo.EVENTS.c.created_at,
                                                               repo.EVENTS.c.type)).all()
    return [(row.type, row.job_id, row.batch_id, row.created_at.timestamp()) for row in rows]


def test_a_start_and_an_ending_record_the_events_the_job_asked_for(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    both = _insert(sessions, tenant, ("started", "completed"))
    completed_only = _insert(sessions, tenant, ("completed",))
    none = _insert(sessions, tenant, None)
    for job in (both, completed_only, none):
        with sessions.begin() as session:  # the worker's start: its own statement
            assert jobs_sql.start(session, job.id, attempt=1, now=T0 + 1) is not None
        _move(sessions, _get(sessions, job.id), Status.SUCCEEDED, T0 + 2)
    assert _events(sessions) == [("job.started", both.id, None, T0 + 1),
                                 ("job.completed", both.id, None, T0 + 2),
                                 ("job.completed", completed_only.id, None, T0 + 2)]
    with sessions() as session:
        ids = [row.id for row in session.execute(sa.select(repo.EVENTS.c.id))]
    assert all(i.startswith("msg_") and len(i) == 36 for i in ids) and len(set(ids)) == 3


def test_an_event_is_recorded_only_with_its_change(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    job = _insert(sessions, tenant, ("completed",))
    with sessions.begin() as session:
        assert jobs_sql.transition(session, job.id, src=Q, attempt=1, dst=Status.CANCELLED,
                                   now=T0 + 1)
        session.rollback()
    assert _events(sessions) == []
    _move(sessions, job, Status.CANCELLED, T0 + 2)  # a cancel before it started
    assert _events(sessions) == [("job.completed", job.id, None, T0 + 2)]


def test_an_ending_with_the_next_start_in_one_statement_records_both(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    first = _insert(sessions, tenant, ("completed",))
    second = _insert(sessions, tenant, ("started",))
    with sessions.begin() as session:
        assert jobs_sql.start(session, first.id, attempt=1, now=T0 + 1) is not None
    with sessions.begin() as session:
        ended, started = jobs_sql.end_and_start(
            session, first.id, attempt=1, dst=Status.FAILED, now=T0 + 2,
            fields={"error": "boom"}, next_id=second.id, next_attempt=1, token="t",
            dispatched_at=None)
    assert ended and started is not None
    assert sorted(_events(sessions)) == [("job.completed", first.id, None, T0 + 2),
                                         ("job.started", second.id, None, T0 + 2)]


def _batch(sessions: sessionmaker[Session], tenant: Tenant, events: tuple[str, ...],
           total: int) -> tuple[Batch, list[Job]]:
    hook = Webhook(url=URL, events=events)
    batch = Batch(id=f"00000000-0000-7000-8000-00000000000{total}", tenant_id=tenant.id,
                  tier=tenant.tier, kind="echo", total=total, max_attempts=3,
                  idempotency_key=None, content_hash="x" * 64, cancelled=False, created_at=T0,
                  webhook_url=hook.url, webhook_events=hook.column)
    ids = [f"00000000-0000-7000-9000-00000000000{i}" for i in range(total)]
    with sessions.begin() as session:
        assert batches_sql.insert_batch(session, batch)
        batches_sql.insert_items(session, [
            batches_sql.item_values(job_id=job_id, batch=batch, index=i, payload={}, now=T0)
            for i, job_id in enumerate(ids)])
    return batch, [_get(sessions, job_id) for job_id in ids]


def test_a_batch_reports_each_item_and_its_end_once(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    batch, items = _batch(sessions, tenant, ("completed", "item.completed"), total=3)
    _move(sessions, items[0], Status.CANCELLED, T0 + 1)
    for n, item in enumerate(items[1:], start=2):
        _move(sessions, _move(sessions, _move(sessions, item, Q, T0 + n), R, T0 + n),
              Status.SUCCEEDED, T0 + n)
        if n == 2:
            assert [e[0] for e in _events(sessions)] == ["batch.item.completed"] * 2
    found = _events(sessions)
    assert sorted(e[0] for e in found) == ["batch.completed"] + ["batch.item.completed"] * 3
    assert ("batch.completed", None, batch.id, T0 + 3) in found
    with sessions() as session:
        assert repo.deliveries(session, batch_id=batch.id)[0].type == "batch.completed"
        assert [d.type for d in repo.deliveries(session, job_id=items[1].id)] == [
            "batch.item.completed"]


def test_a_batch_that_wants_only_its_end_has_items_without_their_own_events(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    batch, items = _batch(sessions, tenant, ("completed",), total=2)
    for item in items:
        _move(sessions, item, Status.EXPIRED, T0 + 5)
    assert _events(sessions) == [("batch.completed", None, batch.id, T0 + 5)]


def _due(sessions: sessionmaker[Session], now: float) -> list[str]:
    with sessions() as session:
        return [event_id for event_id, _ in repo.due(session, now=now, limit=10, room={},
                                                      tenant_room=10)]


def test_one_claimer_wins_each_event_and_a_lapsed_claim_is_taken_again(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    job = _insert(sessions, tenant, ("completed",))
    _move(sessions, job, Status.CANCELLED, T0 + 1)
    ids = _due(sessions, T0 + 1)
    assert len(ids) == 1 and _due(sessions, T0) == []  # not due before its change
    with sessions.begin() as session:
        won = repo.claim(session, ids, now=T0 + 2, until=T0 + 32)
    with sessions.begin() as session:
        assert repo.claim(session, ids, now=T0 + 3, until=T0 + 33) == []  # held
    assert [e.id for e in won] == ids and won[0].url == URL and won[0].tries == 0
    assert _due(sessions, T0 + 31) == [] and _due(sessions, T0 + 32) == ids  # lapsed


def test_the_due_read_gives_each_tenant_its_turn_and_no_more_than_its_room(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    with sessions.begin() as session:
        others = [tenants_sql.create_tenant(session, name=name, tier="free",
                                            api_key_hash=f"hash-{name}", now=T0).id
                  for name in ("second", "third")]
    second, third = others
    # The first tenant's 50 are due longest; each other tenant has 3, due later.
    rows = [(tenant.id, T0 + i / 100) for i in range(50)] + [
        (owner, T0 + 10 + i) for owner in others for i in range(3)]
    with sessions.begin() as session:
        session.execute(sa.insert(repo.EVENTS), [
            {"id": f"msg_{n:032d}", "tenant_id": owner, "job_id": None, "batch_id": None,
             "type": "job.completed", "url": URL, "created_at": dt(at),
             "next_attempt_at": dt(at)} for n, (owner, at) in enumerate(rows)])

    def due(limit: int, room: dict[str, int], now: float = T0 + 60) -> list[str]:
        with sessions() as session:
            return [owner for _, owner in repo.due(session, now=now, limit=limit, room=room,
                                                   tenant_room=4)]

    # Turns: each tenant's longest due first, then each one's second; at most 4 each.
    assert due(6, {}) == [tenant.id, second, third] * 2
    assert due(16, {}) == [tenant.id, second, third] * 3 + [tenant.id]
    # A tenant with no room left is not read; one with some is read no further.
    assert due(16, {tenant.id: 0}) == [second, third] * 3
    assert due(16, {tenant.id: 1, third: 0}) == [tenant.id, second, second, second]
    assert due(16, {}, now=T0 + 10) == [tenant.id, second, third] + [tenant.id] * 3


def _state(sessions: sessionmaker[Session], event_id: str) -> dict[str, Any]:
    with sessions() as session:
        row = session.execute(sa.select(repo.EVENTS).where(repo.EVENTS.c.id == event_id)).one()
        tries = session.execute(sa.select(sa.func.count()).select_from(repo.ATTEMPTS).where(
            repo.ATTEMPTS.c.event_id == event_id)).scalar_one()
    return {"status": row.status, "tries": row.tries, "attempts": tries,
            "next": row.next_attempt_at.timestamp(),
            "finished": None if row.finished_at is None else row.finished_at.timestamp()}


def test_a_try_leaves_the_event_due_again_delivered_or_given_up(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    events = []
    for _ in range(2):
        job = _insert(sessions, tenant, ("completed",))
        _move(sessions, job, Status.CANCELLED, T0 + 1)
    with sessions.begin() as session:
        events = repo.claim(session, _due(sessions, T0 + 1), now=T0 + 1, until=T0 + 31)
    first, second = events
    with sessions.begin() as session:
        repo.record_try(session, first, at=T0 + 2, status_code=503, error="HTTP 503",
                        duration_ms=3.0, next_at=T0 + 7)
    assert _state(sessions, first.id) == {"status": "pending", "tries": 1, "attempts": 1,
                                          "next": T0 + 7, "finished": None}
    with sessions.begin() as session:
        repo.record_try(session, first, at=T0 + 8, status_code=204, error=None,
                        duration_ms=1.0, next_at=None)
        repo.record_try(session, second, at=T0 + 8, status_code=None, error="refused",
                        duration_ms=1.0, next_at=None)
    assert _state(sessions, first.id)["status"] == "delivered"
    assert _state(sessions, second.id) | {"next": 0} == {
        "status": "failed", "tries": 1, "attempts": 1, "next": 0, "finished": T0 + 8}
    with sessions() as session:
        shown = repo.deliveries(session, job_id=first.job_id)
    assert [(a.status_code, a.error) for a in shown[0].attempts] == [(503, "HTTP 503"),
                                                                     (204, None)]
    with sessions.begin() as session:
        assert repo.forget(session, job_ids=[first.job_id or "", second.job_id or ""]) == 2
    with sessions() as session:
        assert session.execute(sa.select(sa.func.count()).select_from(repo.ATTEMPTS)
                               ).scalar_one() == 0


def test_a_tenants_secret_is_made_once_and_a_rotation_keeps_the_old_one_a_while(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    with sessions.begin() as session:
        first = repo.secrets(session, tenant.id, now=T0, made="whsec_a")
        again = repo.secrets(session, tenant.id, now=T0, made="whsec_b")
    assert first.signing == again.signing == ["whsec_a"]
    with sessions.begin() as session:
        rotated = repo.rotate(session, tenant.id, made="whsec_c", now=T0, previous_for_s=60)
    assert rotated.signing == ["whsec_c", "whsec_a"] and rotated.previous_until == T0 + 60
    with sessions.begin() as session:
        assert repo.secrets(session, tenant.id, now=T0 + 59, made="x").signing == [
            "whsec_c", "whsec_a"]
        assert repo.secrets(session, tenant.id, now=T0 + 60, made="x").signing == ["whsec_c"]


def _get(sessions: sessionmaker[Session], job_id: str) -> Job:
    with sessions() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None
    return job
