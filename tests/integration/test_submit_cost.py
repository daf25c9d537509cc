"""What one submit costs, counted (never timed): Redis round trips and SQL statements.

A submit's admission is one Redis round trip, whatever it checks (rate, live workers,
measured mean, the job's own deadline) and whether it is accepted or refused; an accepted
submit that found a slot free adds one more after the commit: the offer of the best runnable
job to a free slot, or the dispatcher's doorbell (``DispatchIndex.offer``). Its row is one
INSERT in one transaction, keyed or not; on PostgreSQL that INSERT is sent alone, a
transaction of its own (``jobs.store.direct``). An idempotent resubmit's INSERT finds its key
held: it gets the first job, read then, and makes no second row.
Round trips are counted at the client's socket (``send_packed_command``: one per command or
pipeline sent), on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from redis.connection import AbstractConnection

from jobs.admission import limits
from jobs.admission import submit as submission
from jobs.admission.submit import Submission
from jobs.core.domain import Job, NewJob, Tenant
from jobs.core.errors import CapacityExceeded, IdempotencyConflict, TenantLimitExceeded
from jobs.index.base import IndexedJob
from jobs.index.keys import IndexKeys
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.direct import DirectConnection, direct_pool
from jobs.store.engine import make_engine, make_sessionmaker
from jobs.store.models import JobRow
from jobs.store.pipeline import OneTrip
from workers.handlers import default_registry

pytestmark = pytest.mark.integration

T0 = 1_800_000_000.0
TIERS = {"std": {"base_priority": 10, "max_wait_s": 60, "tenant_share": 0.5,
                 "rate_per_s": 0.5, "rate_burst": 3}}


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    """Live workers (no configured concurrency), a measured mean and a rate limit: every
    input the admission reads is there."""
    settings = load_settings(database_url=db_url, key_prefix=key_prefix, tiers=TIERS)
    engine = make_engine(db_url)
    index = RedisIndex(redis_client, key_prefix)
    rt = Runtime(settings=settings, policy=settings.build_policy(), engine=engine,
                 sessions=make_sessionmaker(engine), redis=redis_client, index=index,
                 clock=lambda: T0, direct=direct_pool(engine, size=4))
    index.register_worker("w1", slots=4, ttl_s=600, now=T0)
    redis_client.hset(IndexKeys(key_prefix).service_mean,
                      mapping={"mean_s": "2.0", "samples": 50})
    yield rt
    if rt.direct is not None:
        rt.direct.close()
    engine.dispose()


@pytest.fixture
def tenant(runtime: Runtime) -> Tenant:
    with runtime.sessions.begin() as session:
        return tenants_sql.create_tenant(session, name="acme", tier="std",
                                        api_key_hash="h", now=T0)


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The first word of every command or pipeline sent to Redis from now on."""
    sent: list[bytes] = []
    original = AbstractConnection.send_packed_command

    def counted(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        first = command if isinstance(command, bytes | memoryview) else command[0]
        sent.append(bytes(first).split(b"\r\n")[2])
        original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    return sent


@pytest.fixture
def statements(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every SQL statement sent from now on, and "COMMIT"/"ROLLBACK": the engine's, and the
    direct connections' (PostgreSQL's hot path, ``jobs.store.direct``), where a statement is
    its own transaction and so is followed by its implicit "COMMIT"."""
    seen: list[str] = []
    for kind in (DirectConnection, OneTrip):  # OneTrip: a statement sent with its COMMIT
        monkeypatch.setattr(kind, "execute", _seen_by(kind.execute, seen))

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement.split()[0].upper())

    listeners = [("before_cursor_execute", on_execute),
                 ("commit", lambda conn: seen.append("COMMIT")),
                 ("rollback", lambda conn: seen.append("ROLLBACK"))]
    for name, fn in listeners:
        sa.event.listen(runtime.engine, name, fn)
    yield seen
    for name, fn in listeners:
        sa.event.remove(runtime.engine, name, fn)


def _seen_by(execute: Callable[..., Any], seen: list[str]) -> Callable[..., Any]:
    def on_direct(self: DirectConnection, stmt: Any, params: Any = None) -> Any:
        result = execute(self, stmt, params)
        seen.extend([str(stmt).split()[0].upper(), "COMMIT"])
        return result

    return on_direct


def submit(runtime: Runtime, tenant: Tenant, **fields: Any) -> submission.Submitted:
    work: dict[str, Any] = {"kind": "echo", "payload": {"n": 1}, **fields}
    return submission.submit(runtime, default_registry(), tenant, Submission(**work))


def _warm(runtime: Runtime, tenant: Tenant) -> None:
    """Load the scripts and open the connections, so only the submit itself is counted."""
    submit(runtime, tenant, max_wait_s=600)


def test_an_admission_is_one_round_trip_and_a_submit_two(
    runtime: Runtime, tenant: Tenant, round_trips: list[bytes]
) -> None:
    _warm(runtime, tenant)
    round_trips.clear()
    new = NewJob(tenant_id=tenant.id, tier="std", kind="echo", payload={},
                 order_key=runtime.policy.order_key("std", T0 + 1), enqueued_at=T0 + 1,
                 max_wait_s=60)
    placed = limits.admit(runtime, tenant, new)
    assert round_trips == [b"EVALSHA"]
    assert placed.position == 1 and placed.estimated_wait_s == 0.0

    round_trips.clear()
    submitted = submit(runtime, tenant, max_wait_s=600)
    assert submitted.created
    # The admission; after the COMMIT, the offer to a free slot (or the doorbell), one script.
    assert round_trips == [b"EVALSHA", b"EVALSHA"]


def test_a_submit_that_finds_every_slot_held_offers_nothing(
    runtime: Runtime, tenant: Tenant, round_trips: list[bytes]
) -> None:
    """With no slot free at its admission, the job waits for the next slot to free (which
    takes the best job) or the dispatcher: an offer would find nothing to do."""
    _warm(runtime, tenant)
    runtime.index.dispatch(4, now=T0, lease_ttl_s=600)  # the warm-up's job
    for n in range(3):
        runtime.index.requeue(IndexedJob(job_id=f"other-{n}", tenant=f"other-{n}", tier="std",
                                         order_key=0.0))
    assert len(runtime.index.dispatch(4, now=T0, lease_ttl_s=600)) == 3
    round_trips.clear()
    assert submit(runtime, tenant).created
    assert round_trips == [b"EVALSHA"]  # the admission alone

    runtime.index.release("other-0")
    round_trips.clear()
    assert submit(runtime, tenant).created
    assert round_trips == [b"EVALSHA", b"EVALSHA"]  # and the offer to the free slot


def test_a_refusal_is_one_round_trip(
    runtime: Runtime, tenant: Tenant, round_trips: list[bytes]
) -> None:
    _warm(runtime, tenant)
    for _ in range(2):
        submit(runtime, tenant)  # the bucket (burst 3, no time passes) is empty now
    round_trips.clear()
    with pytest.raises(TenantLimitExceeded) as rate:
        submit(runtime, tenant)
    assert rate.value.details["limit"] == "rate"
    assert round_trips == [b"EVALSHA"]

    with runtime.sessions.begin() as session:
        tenants_sql.update_tenant(session, tenant.id, rate_per_s=1000.0, rate_burst=1000)
        tenant = tenants_sql.get_tenant(session, tenant.id) or tenant
    runtime.clock = lambda: T0 + 10  # the bucket fills up again
    round_trips.clear()
    with pytest.raises(CapacityExceeded) as late:  # 3 queued, 2 slots for acme's cap
        submit(runtime, tenant, max_wait_s=1)
    assert late.value.details["limit"] == "deadline"
    assert round_trips == [b"EVALSHA"]


def test_a_submit_is_one_insert_in_one_transaction(
    runtime: Runtime, tenant: Tenant, statements: list[str]
) -> None:
    _warm(runtime, tenant)
    statements.clear()
    submit(runtime, tenant)
    assert [s for s in statements if s != "BEGIN"] == ["INSERT", "COMMIT"]

    statements.clear()
    submit(runtime, tenant, idempotency_key="k1")  # a fresh key reads nothing first
    assert [s for s in statements if s != "BEGIN"] == ["INSERT", "COMMIT"]


def _rows(runtime: Runtime, tenant: Tenant) -> int:
    with runtime.sessions() as session:
        count = sa.select(sa.func.count()).select_from(JobRow).where(
            JobRow.tenant_id == tenant.id)
        return int(session.scalar(count) or 0)


def test_an_idempotent_resubmit_returns_the_first_job_without_a_second_row(
    runtime: Runtime, tenant: Tenant, statements: list[str]
) -> None:
    """The resubmit's INSERT finds its key held and does nothing; the holder is read, and
    the resubmit's own index entry is taken back out."""
    first = submit(runtime, tenant, idempotency_key="once")
    statements.clear()
    again = submit(runtime, tenant, idempotency_key="once")
    assert first.created and not again.created
    assert again.progress.job == first.progress.job
    sent = [s for s in statements if s != "BEGIN"]
    assert sent[:4] == ["INSERT", "COMMIT", "SELECT", "ROLLBACK"]  # then its place, read
    assert sent.count("INSERT") == 1
    assert _rows(runtime, tenant) == 1
    assert runtime.index.tenant_queued(tenant.id) == 1  # only the first job's entry


def test_a_reused_key_for_other_work_is_a_conflict_that_leaves_nothing(
    runtime: Runtime, tenant: Tenant
) -> None:
    """Other work under a used key is refused (409) and leaves no row and no index entry."""
    first = submit(runtime, tenant, idempotency_key="k2")
    with pytest.raises(IdempotencyConflict) as conflict:
        submit(runtime, tenant, idempotency_key="k2", kind="sleep", payload={"seconds": 1})
    assert conflict.value.details["job_id"] == first.progress.job.id
    assert _rows(runtime, tenant) == 1
    assert runtime.index.tenant_queued(tenant.id) == 1


def test_a_resubmit_the_admission_refuses_still_gets_the_first_job(
    runtime: Runtime, tenant: Tenant
) -> None:
    """A retry of accepted work is answered with that job while new work is refused: the
    key is read once the admission refuses. A new key is refused as before."""
    first = submit(runtime, tenant, idempotency_key="kept")
    with pytest.raises(TenantLimitExceeded):  # the rate's burst of 3 spent at one instant
        for n in range(4):
            submit(runtime, tenant, payload={"n": n})
    again = submit(runtime, tenant, idempotency_key="kept")
    assert not again.created and again.progress.job.id == first.progress.job.id
    with pytest.raises(TenantLimitExceeded):
        submit(runtime, tenant, idempotency_key="new")
    with pytest.raises(IdempotencyConflict):  # still compared with the first job's work
        submit(runtime, tenant, idempotency_key="kept", kind="sleep", payload={"seconds": 1})
    assert _rows(runtime, tenant) == 3


def test_the_job_returned_is_the_row_as_stored(runtime: Runtime, tenant: Tenant) -> None:
    submitted = submit(runtime, tenant, idempotency_key="k", max_wait_s=30.5)
    job: Job = submitted.progress.job
    with runtime.sessions() as session:
        assert jobs_sql.get_job(session, job.id) == job
