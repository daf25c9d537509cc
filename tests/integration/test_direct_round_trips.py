"""The direct pool's ways of saving a round trip: a statement and its COMMIT sent together
(``jobs.store.pipeline.one_trip``), whose rows come back before the COMMIT's answer, and the
wait for a job's commit lock (``DirectPool.await_commit``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from jobs.execution.leases import is_sql_outage
from jobs.store.direct import DirectPool
from jobs.store.engine import make_engine
from jobs.store.pipeline import locked, one_trip
from tests.integration.held_commits import HeldCommit

pytestmark = pytest.mark.integration

INSERT = sa.text("INSERT INTO ahead_probe (id) VALUES (:id)")


@pytest.fixture
def engine(pg_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(pg_url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE ahead_probe (id int PRIMARY KEY)")
    yield engine
    engine.dispose()


@pytest.fixture
def pool(engine: sa.Engine) -> Iterator[DirectPool]:
    pool = DirectPool(engine, size=2)
    yield pool
    pool.close()


def ids(engine: sa.Engine) -> list[int]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text("SELECT id FROM ahead_probe ORDER BY id"))
                    .scalars())


def in_transaction(engine: sa.Engine) -> int:
    """Sessions of this database inside a transaction (the test's own is not)."""
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%'")).scalar_one())


RETURNING = sa.text("INSERT INTO ahead_probe (id) VALUES (:id) RETURNING id, id * 2 AS twice")


@pytest.fixture
def held(engine: sa.Engine) -> Iterator[Callable[..., HeldCommit]]:
    """Every COMMIT of a row inserted into ``ahead_probe`` held (``fail``: lost)."""
    made: list[HeldCommit] = []

    def hold(*, fail: bool = False) -> HeldCommit:
        made.append(HeldCommit(engine, event="INSERT", table="ahead_probe", fail=fail))
        return made[-1]

    yield hold
    for one in made:
        one.close()


def test_a_statement_and_its_commit_are_one_trip_and_its_connection_is_kept_clean(
    pool: DirectPool, engine: sa.Engine,
) -> None:
    for n in (1, 2, 3):  # the statement is prepared once on its connection, then reused
        with one_trip(pool) as trip:
            result = trip.execute(RETURNING, {"id": n})
            assert [tuple(row) for row in result] == [(n, 2 * n)] and result.rowcount == 1
        assert ids(engine) == list(range(1, n + 1))
    assert in_transaction(engine) == 0
    with pool.connection() as connection:  # back in the pool, out of pipeline mode
        assert connection.execute(RETURNING, {"id": 9}).first() == (9, 18)


def test_the_rows_come_back_before_the_commit_has_landed(
    pool: DirectPool, engine: sa.Engine, held: Callable[..., HeldCommit],
) -> None:
    holder = held()
    with one_trip(pool) as trip:
        assert trip.execute(RETURNING, {"id": 1}).first() == (1, 2)
        assert ids(engine) == []  # the COMMIT is held on the server
        holder.let_go()
        trip.commit()
        assert ids(engine) == [1]
    assert ids(engine) == [1]


def test_a_statement_that_fails_commits_nothing_and_its_connection_is_kept(
    pool: DirectPool, engine: sa.Engine,
) -> None:
    with one_trip(pool) as trip:
        trip.execute(RETURNING, {"id": 1})
    with pytest.raises(sa.exc.IntegrityError), one_trip(pool) as trip:
        trip.execute(RETURNING, {"id": 1})
    with pytest.raises(sa.exc.DataError), one_trip(pool) as trip:
        trip.execute(RETURNING, {"id": 2**40})  # out of int's range
    assert ids(engine) == [1] and in_transaction(engine) == 0
    with one_trip(pool) as trip:
        trip.execute(RETURNING, {"id": 2})
    assert ids(engine) == [1, 2]


def test_a_commit_lost_with_its_session_fails_as_an_outage_and_lands_nothing(
    pool: DirectPool, engine: sa.Engine, held: Callable[..., HeldCommit],
) -> None:
    holder = held(fail=True)
    with pytest.raises(sa.exc.DBAPIError) as failed, one_trip(pool) as trip:
        assert trip.execute(RETURNING, {"id": 1}).first() == (1, 2)  # rows, then no COMMIT
        holder.let_go()
    assert is_sql_outage(failed.value)
    assert ids(engine) == []
    with engine.begin() as connection:
        connection.exec_driver_sql("DROP TRIGGER hold_commit ON ahead_probe")
    with one_trip(pool) as trip:  # the dead connection was not kept
        trip.execute(RETURNING, {"id": 2})
    assert ids(engine) == [2]


def test_waiting_for_a_commit_lock_is_one_round_trip_that_leaves_nothing_held(
    pool: DirectPool, engine: sa.Engine,
) -> None:
    """``await_commit`` takes a job's commit lock shared and lets it go at once: it returns
    when the submit holding it ends, False past its wait, and its connection is clean."""
    with locked(pool, "job-1") as submitting:
        assert not pool.await_commit("job-1", wait_s=0.1)  # the submit hangs
        assert pool.await_commit("job-2", wait_s=0.1)  # another job's lock is not this one
        assert in_transaction(engine) == 1  # only the submit's
        submitting.execute(INSERT, {"id": 1})  # sent with its COMMIT
    assert pool.await_commit("job-1", wait_s=0.1)
    assert in_transaction(engine) == 0
    assert ids(engine) == [1]


def test_a_locked_transaction_that_fails_or_sends_nothing_rolls_back_and_lets_go(
    pool: DirectPool, engine: sa.Engine,
) -> None:
    with pytest.raises(RuntimeError), locked(pool, "job-1"):
        raise RuntimeError("the offer failed")  # before its statement
    with locked(pool, "job-1") as submitting:
        submitting.execute(INSERT, {"id": 1})
    with pytest.raises(sa.exc.IntegrityError), locked(pool, "job-2") as submitting:
        submitting.execute(INSERT, {"id": 1})  # its COMMIT goes with it, and is not run
    assert ids(engine) == [1] and in_transaction(engine) == 0
    assert pool.await_commit("job-1", wait_s=0.1) and pool.await_commit("job-2", wait_s=0.1)
    with locked(pool, "job-3") as submitting:  # the connections went back clean
        submitting.execute(INSERT, {"id": 3})
    assert ids(engine) == [1, 3]
