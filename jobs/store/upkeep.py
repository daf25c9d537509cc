"""The leader's SQL: the index epoch, the leadership row that fences a deposed leader's
decisions, and retention (finished jobs pruned into tombstones and totals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.core.pools import DEFAULT_POOL
from jobs.core.states import TERMINAL, Status
from jobs.store import webhooks
from jobs.store.engine import bound_leader_transaction
from jobs.store.models import (
    IndexStateRow,
    LeadershipRow,
    PoolEpochRow,
)
from jobs.store.rows import (
    JOBS,
    TOMBSTONES,
    TOTALS,
    dialect,
    dt,
    rowcount,
)


def index_epoch(session: Session, pool: str = DEFAULT_POOL) -> int | None:
    """The epoch SQL holds for the pool's index (None before its first reconciler round)."""
    row: IndexStateRow | PoolEpochRow | None
    if pool == DEFAULT_POOL:
        row = session.get(IndexStateRow, 1, populate_existing=True)
    else:
        row = session.get(PoolEpochRow, pool, populate_existing=True)
    return None if row is None else row.epoch


def advance_epoch(
    session: Session, *, expected: int | None, epoch: int, pool: str = DEFAULT_POOL
) -> bool:
    """Compare-and-set the pool's index epoch from ``expected`` to ``epoch``; True iff it
    moved."""
    default = pool == DEFAULT_POOL
    if expected is None:
        try:
            with session.begin_nested():
                session.add(IndexStateRow(id=1, epoch=epoch) if default
                            else PoolEpochRow(pool=pool, epoch=epoch))
        except IntegrityError:
            return False
        return True
    if default:
        stmt = (sa.update(IndexStateRow)
                .where(IndexStateRow.id == 1, IndexStateRow.epoch == expected)
                .values(epoch=epoch))
    else:
        stmt = (sa.update(PoolEpochRow)
                .where(PoolEpochRow.pool == pool, PoolEpochRow.epoch == expected)
                .values(epoch=epoch))
    return rowcount(session, stmt) == 1


def claim_lead(session: Session, token: str) -> None:
    """Name ``token`` the leader in SQL. Waits for a deposed leader's decision in progress
    (it holds the row), so what the caller reads afterwards includes it; on PostgreSQL at
    most a third of the leader TTL (``lock_timeout``: the caller tries again next turn),
    and a holder stalled in its transaction is ended by the server
    (``jobs.store.engine.bound_leader_transaction``)."""
    bound_leader_transaction(session)
    stmt = sa.update(LeadershipRow).where(LeadershipRow.id == 1).values(holder=token)
    if rowcount(session, stmt) == 0:
        session.add(LeadershipRow(id=1, holder=token))
        session.flush()


def holds_lead(session: Session, token: str) -> bool:
    """True while SQL names ``token`` the leader; holds the row until the caller's
    transaction ends, so no successor claims SQL while the caller decides. That transaction
    is bounded from here on (``jobs.store.engine.bound_leader_transaction``): should the
    caller stall in it, the server ends it and the successor's claim goes through."""
    bound_leader_transaction(session)
    stmt = (
        sa.update(LeadershipRow)
        .where(LeadershipRow.id == 1, LeadershipRow.holder == token)
        .values(holder=token)
    )
    return rowcount(session, stmt) == 1


@dataclass(frozen=True, kw_only=True)
class Pruned:
    """What a prune removed from one tier: how many jobs, and how many of them were
    abandoned (succeeded, the result never fetched)."""

    tier: str
    pruned: int
    abandoned: int


def prune_finished(session: Session, *, tier: str, before: float, limit: int,
                   now: float) -> Pruned:
    """Delete up to ``limit`` of the tier's jobs that finished before ``before``, oldest
    first, leave a tombstone for each and add them to the tier's totals.

    Two bounded statements: ``SELECT id ... ORDER BY finished_at LIMIT n`` (the tier's
    finished-at index), then ``DELETE ... WHERE id IN (<those ids>) RETURNING`` (the primary
    key). As one ``DELETE ... WHERE id IN (SELECT ...)`` PostgreSQL may plan a hash join
    over the whole table. A finished row never changes state, and one another pruner took
    in between is not returned, so nothing is counted twice."""
    due = (
        sa.select(JOBS.c.id)
        .where(JOBS.c.tier == tier,
               # As a row value, only the (tier, finished_at) index can serve the range:
               # walked by finished_at alone, other tiers' older rows would be read first.
               sa.tuple_(JOBS.c.tier, JOBS.c.finished_at) < sa.tuple_(tier, dt(before)),
               # Implied by the two above; said, so that the index (partial on PostgreSQL,
               # jobs.store.models) is seen to hold every row asked for.
               JOBS.c.finished_at.is_not(None),
               JOBS.c.status.in_([status.value for status in TERMINAL]))
        .order_by(JOBS.c.tier, JOBS.c.finished_at)
        .limit(limit)
    )
    ids = list(session.scalars(due))
    if not ids:
        return Pruned(tier=tier, pruned=0, abandoned=0)
    stmt = sa.delete(JOBS).where(JOBS.c.id.in_(ids)).returning(
        JOBS.c.id, JOBS.c.tenant_id, JOBS.c.status, JOBS.c.result_fetched_at
    )
    rows = session.execute(stmt.execution_options(synchronize_session=False)).all()
    if not rows:
        return Pruned(tier=tier, pruned=0, abandoned=0)
    webhooks.forget(session, job_ids=[row.id for row in rows])  # their deliveries go too
    at = dt(now)
    session.execute(sa.insert(TOMBSTONES), [
        {"id": row.id, "tenant_id": row.tenant_id, "tier": tier, "pruned_at": at}
        for row in rows
    ])
    abandoned = sum(1 for row in rows
                    if row.status == Status.SUCCEEDED.value and row.result_fetched_at is None)
    _add_totals(session, tier, pruned=len(rows), abandoned=abandoned)
    return Pruned(tier=tier, pruned=len(rows), abandoned=abandoned)


def _add_totals(session: Session, tier: str, *, pruned: int, abandoned: int) -> None:
    """Add to the tier's counters (an upsert: the first prune of a tier makes its row)."""
    insert = pg_insert(TOTALS) if dialect(session) == "postgresql" else sqlite_insert(TOTALS)
    stmt = insert.values(tier=tier, pruned=pruned, abandoned=abandoned)
    stmt = stmt.on_conflict_do_update(
        index_elements=[TOTALS.c.tier],
        set_={"pruned": TOTALS.c.pruned + pruned, "abandoned": TOTALS.c.abandoned + abandoned},
    )
    session.execute(stmt)


def prune_tombstones(session: Session, *, tier: str, before: float, limit: int) -> int:
    """Delete up to ``limit`` of the tier's tombstones made before ``before``, oldest first:
    past that, a pruned job's id is answered ``404`` like one that never was."""
    due = (
        sa.select(TOMBSTONES.c.id)
        .where(TOMBSTONES.c.tier == tier, TOMBSTONES.c.pruned_at < dt(before))
        .order_by(TOMBSTONES.c.pruned_at)
        .limit(limit)
    )
    ids = list(session.scalars(due))
    if not ids:
        return 0
    stmt = sa.delete(TOMBSTONES).where(TOMBSTONES.c.id.in_(ids))
    result = cast(CursorResult[Any],
                  session.execute(stmt.execution_options(synchronize_session=False)))
    return result.rowcount


def was_pruned(session: Session, job_id: str, *, tenant_id: str) -> bool:
    """True when this tenant's job was pruned (another tenant's: False, as for any id)."""
    stmt = sa.select(TOMBSTONES.c.id).where(
        TOMBSTONES.c.id == job_id, TOMBSTONES.c.tenant_id == tenant_id
    )
    return session.execute(stmt.limit(1)).first() is not None
