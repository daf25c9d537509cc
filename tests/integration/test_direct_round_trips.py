"""The direct pool's transactions that save a round trip: one begun ahead
(``DirectPool.begin_ahead``), whose BEGIN goes out before its statements are known, so that
round trip runs beside other work, and which then behaves as any transaction of the pool (one
never used is rolled back); and the wait for a job's commit lock (``await_commit``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from jobs.execution.leases import is_sql_outage
from jobs.store.direct import DirectPool
from jobs.store.engine import make_engine

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


def begun(engine: sa.Engine) -> None:
    """Until the server has run a BEGIN sent ahead (its session idle in a transaction)."""
    deadline = time.monotonic() + 10
    while in_transaction(engine) != 1:
        assert time.monotonic() < deadline, "the BEGIN sent ahead never ran"
        time.sleep(0.01)


def test_a_transaction_begun_ahead_commits_its_statements_as_one(
    pool: DirectPool, engine: sa.Engine,
) -> None:
    ahead = pool.begin_ahead()
    assert ahead is not None
    begun(engine)  # BEGIN is out before any statement is
    with pool.transaction(ahead=ahead) as connection:
        connection.execute(INSERT, {"id": 1})
        connection.execute(INSERT, {"id": 2})
        assert ids(engine) == []  # not committed yet
    assert ids(engine) == [1, 2]
    assert in_transaction(engine) == 0
    ahead.discard()  # used: nothing left to end
    with pool.transaction() as connection:  # its connection went back, clean
        connection.execute(INSERT, {"id": 3})
    assert ids(engine) == [1, 2, 3]


def test_a_transaction_begun_ahead_rolls_back_on_an_error(
    pool: DirectPool, engine: sa.Engine,
) -> None:
    ahead = pool.begin_ahead()
    assert ahead is not None
    with pytest.raises(sa.exc.IntegrityError), pool.transaction(ahead=ahead) as connection:
        connection.execute(INSERT, {"id": 1})
        connection.execute(INSERT, {"id": 1})
    assert ids(engine) == [] and in_transaction(engine) == 0


def test_one_never_used_is_rolled_back_and_its_connection_kept(
    pool: DirectPool, engine: sa.Engine,
) -> None:
    ahead = pool.begin_ahead()
    assert ahead is not None
    ahead.discard()
    assert in_transaction(engine) == 0
    again = pool.begin_ahead()  # on the same connection, idle again
    assert again is not None and again.raw is ahead.raw
    again.discard()


def test_one_whose_session_died_meanwhile_fails_as_an_outage(
    pool: DirectPool, engine: sa.Engine,
) -> None:
    """The database lost the session between the BEGIN and its statements: the caller is
    told as for any lost connection (and falls back as on an outage); nothing committed."""
    ahead = pool.begin_ahead()
    assert ahead is not None
    begun(engine)
    with engine.connect() as connection:
        connection.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND state LIKE 'idle in transaction%'"))
    deadline = time.monotonic() + 10
    while in_transaction(engine):  # until that session has ended
        assert time.monotonic() < deadline, "the session was not terminated"
        time.sleep(0.01)
    with pytest.raises(sa.exc.DBAPIError) as failed, pool.transaction(ahead=ahead) as c:
        c.execute(INSERT, {"id": 1})
    assert is_sql_outage(failed.value)
    assert ids(engine) == []
    with pool.transaction() as connection:  # the dead connection was not kept
        connection.execute(INSERT, {"id": 2})
    assert ids(engine) == [2]


def test_waiting_for_a_commit_lock_is_one_round_trip_that_leaves_nothing_held(
    pool: DirectPool, engine: sa.Engine,
) -> None:
    """``await_commit`` takes a job's commit lock shared and lets it go at once: it returns
    when the submit holding it ends, False past its wait, and its connection is clean."""
    with pool.locked("job-1") as submitting:
        submitting.execute(INSERT, {"id": 1})
        assert not pool.await_commit("job-1", wait_s=0.1)  # the submit hangs
        assert pool.await_commit("job-2", wait_s=0.1)  # another job's lock is not this one
        assert in_transaction(engine) == 1  # only the submit's
    assert pool.await_commit("job-1", wait_s=0.1)
    assert in_transaction(engine) == 0
    assert ids(engine) == [1]
