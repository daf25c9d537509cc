"""SQL of webhooks: the outbox of events (recorded by the trigger of migration 0013), each
delivery try, and the tenants' signing secrets.

A deliverer claims a due event by moving its ``next_attempt_at`` past the time a try can
take, compare-and-set on the value it read: of several deliverers one wins, and a deliverer
that dies holding an event lets the claim lapse, so the event is tried again (at least once;
the ``webhook-id`` stays, and receivers deduplicate on it). As everywhere in ``jobs.store``,
functions take a ``Session`` and never commit.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobs.store.models import TenantRow, WebhookAttemptRow, WebhookEventRow
from jobs.store.rows import dt, epoch_or_none, epoch_required

EVENTS = cast(sa.Table, WebhookEventRow.__table__)
ATTEMPTS = cast(sa.Table, WebhookAttemptRow.__table__)
TENANTS = cast(sa.Table, TenantRow.__table__)
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


@dataclass(frozen=True, kw_only=True)
class Event:
    """An event to deliver: ``id`` is its ``webhook-id``."""

    id: str
    tenant_id: str
    job_id: str | None
    batch_id: str | None
    type: str
    url: str
    created_at: float
    tries: int

    @classmethod
    def from_row(cls, row: Any) -> Event:
        return cls(id=row.id, tenant_id=row.tenant_id, job_id=row.job_id,
                   batch_id=row.batch_id, type=row.type, url=row.url,
                   created_at=epoch_required(row.created_at), tries=row.tries)


def due(session: Session, *, now: float, limit: int, room: Mapping[str, int],
        tenant_room: int) -> list[tuple[str, str]]:
    """``(id, tenant_id)`` of at most ``limit`` pending events due by ``now``, no tenant's
    more than it may still start (``room[tenant]``, else ``tenant_room``), the tenants
    taking turns: each one's longest due first, then each one's second, and so on. A
    tenant's backlog, however long, never fills the read, and one with no room is not read.

    Two reads, each bounded by the tenants with pending events and the rows taken, never by
    a backlog, both on the partial index ``(tenant_id, next_attempt_at)`` of pending events
    (migration 0015): the tenants with pending events, each with its earliest (a skip scan,
    one index probe per tenant), then at most its room of each due one's events."""
    earliest = session.execute(_EARLIEST).all()
    turns = sorted((row.first, row.tenant_id) for row in earliest
                   if row.first <= dt(now) and room.get(row.tenant_id, tenant_room) > 0)
    chosen = [tenant for _, tenant in turns[:limit]]
    if not chosen:
        return []
    params: dict[str, Any] = {"now": dt(now)}
    for n, tenant in enumerate(chosen):
        params[f"tenant_{n}"] = tenant
        params[f"room_{n}"] = min(limit, room.get(tenant, tenant_room))
    rows = session.execute(_firsts_of(len(chosen)), params).all()
    taken: dict[str, int] = defaultdict(int)
    ranked = []
    for row in sorted(rows, key=lambda row: (row.next_attempt_at, row.id)):
        taken[row.tenant_id] += 1
        ranked.append((taken[row.tenant_id], row.next_attempt_at, row.id, row.tenant_id))
    return [(event_id, tenant) for *_, event_id, tenant in sorted(ranked)[:limit]]


def _pending(table: sa.FromClause) -> sa.ColumnElement[bool]:
    """Pending events, as the partial index names them: a literal, so that both planners
    match it to the index (a bound parameter would not be)."""
    return table.c.status == sa.literal_column(f"'{PENDING}'")


def _earliest() -> sa.Select[Any]:
    """Each tenant with pending events, and the earliest ``next_attempt_at`` of them: a
    recursive query whose every step is the next tenant id in the index after the last (a
    loose index scan: neither dialect skips on its own), then one probe for its earliest."""
    later = EVENTS.alias("later")
    owners = (sa.select(sa.func.min(EVENTS.c.tenant_id).label("tenant_id"))
              .where(_pending(EVENTS)).cte("owners", recursive=True))
    step = (sa.select(later.c.tenant_id)
            .where(_pending(later), later.c.tenant_id > owners.c.tenant_id)
            .order_by(later.c.tenant_id).limit(1).scalar_subquery())
    owners = owners.union_all(sa.select(step).where(owners.c.tenant_id.is_not(None)))
    first = (sa.select(sa.func.min(later.c.next_attempt_at))
             .where(_pending(later), later.c.tenant_id == owners.c.tenant_id)
             .scalar_subquery())
    return (sa.select(owners.c.tenant_id, first.label("first"))
            .where(owners.c.tenant_id.is_not(None)))


_EARLIEST = _earliest()


@functools.cache
def _firsts_of(tenants: int) -> sa.CompoundSelect[Any]:
    """The first ``room_<n>`` due events of each ``tenant_<n>``: built once per number of
    tenants, as building it costs more than running it."""
    def firsts(n: int) -> sa.Select[Any]:
        read = (sa.select(EVENTS.c.id, EVENTS.c.tenant_id, EVENTS.c.next_attempt_at)
                .where(_pending(EVENTS), EVENTS.c.tenant_id == sa.bindparam(f"tenant_{n}"),
                       EVENTS.c.next_attempt_at <= sa.bindparam("now"))
                .order_by(EVENTS.c.next_attempt_at, EVENTS.c.id)
                .limit(sa.bindparam(f"room_{n}")).subquery())
        return sa.select(read)

    return sa.union_all(*(firsts(n) for n in range(tenants)))


def claim(session: Session, ids: Sequence[str], *, now: float, until: float) -> list[Event]:
    """The events of ``ids`` still pending and due, now held until ``until``: the ones this
    call won."""
    if not ids:
        return []
    rows = session.execute(
        sa.update(EVENTS)
        .where(EVENTS.c.id.in_(ids), EVENTS.c.status == PENDING,
               EVENTS.c.next_attempt_at <= dt(now))
        .values(next_attempt_at=dt(until))
        .returning(*EVENTS.c)).all()
    return [Event.from_row(row) for row in rows]


def record_try(
    session: Session, event: Event, *, at: float, status_code: int | None, error: str | None,
    duration_ms: float, next_at: float | None,
) -> None:
    """A try and where it leaves the event: delivered (no ``error``), due again at
    ``next_at``, or given up (``next_at`` None)."""
    session.execute(sa.insert(ATTEMPTS).values(
        event_id=event.id, at=dt(at), status_code=status_code, error=error,
        duration_ms=duration_ms))
    if error is None:
        values: dict[str, Any] = {"status": DELIVERED, "finished_at": dt(at)}
    elif next_at is None:
        values = {"status": FAILED, "finished_at": dt(at)}
    else:
        values = {"next_attempt_at": dt(next_at)}
    session.execute(sa.update(EVENTS).where(EVENTS.c.id == event.id, EVENTS.c.status == PENDING)
                    .values(tries=EVENTS.c.tries + 1, **values))


@dataclass(frozen=True, kw_only=True)
class Attempt:
    at: float
    status_code: int | None
    error: str | None
    duration_ms: float


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """An event with its tries, as ``GET .../deliveries`` shows it."""

    id: str
    type: str
    url: str
    status: str
    created_at: float
    next_attempt_at: float | None
    attempts: list[Attempt]


def deliveries(
    session: Session, *, job_id: str | None = None, batch_id: str | None = None
) -> list[Delivery]:
    """A job's events (or a batch's own, ``batch.completed``), oldest first."""
    stmt = sa.select(EVENTS).order_by(EVENTS.c.created_at, EVENTS.c.id)
    if job_id is not None:
        stmt = stmt.where(EVENTS.c.job_id == job_id)
    else:
        stmt = stmt.where(EVENTS.c.batch_id == batch_id, EVENTS.c.job_id.is_(None))
    events = session.execute(stmt).all()
    tries: dict[str, list[Attempt]] = defaultdict(list)
    if events:
        for row in session.execute(
                sa.select(ATTEMPTS).where(ATTEMPTS.c.event_id.in_([e.id for e in events]))
                .order_by(ATTEMPTS.c.id)):
            tries[row.event_id].append(Attempt(
                at=epoch_required(row.at), status_code=row.status_code, error=row.error,
                duration_ms=row.duration_ms))
    return [Delivery(id=e.id, type=e.type, url=e.url, status=e.status,
                     created_at=epoch_required(e.created_at),
                     next_attempt_at=epoch_or_none(e.next_attempt_at), attempts=tries[e.id])
            for e in events]


def forget(session: Session, *, job_ids: Iterable[str] = (),
           batch_ids: Iterable[str] = ()) -> int:
    """Delete the events (and their tries) of pruned jobs and batches; how many events."""
    job_ids, batch_ids = list(job_ids), list(batch_ids)
    conditions = []
    if job_ids:
        conditions.append(EVENTS.c.job_id.in_(job_ids))
    if batch_ids:
        conditions.append(EVENTS.c.batch_id.in_(batch_ids))
    if not conditions:
        return 0
    ids = sa.select(EVENTS.c.id).where(sa.or_(*conditions))
    session.execute(sa.delete(ATTEMPTS).where(ATTEMPTS.c.event_id.in_(ids)))
    result: Any = session.execute(sa.delete(EVENTS).where(sa.or_(*conditions)))
    return int(result.rowcount)


# -- signing secrets -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Secrets:
    """What signs a tenant's webhooks now: its secret, and the one it replaced while that
    still signs."""

    current: str
    previous: str | None
    previous_until: float | None

    @property
    def signing(self) -> list[str]:
        return [self.current] + ([self.previous] if self.previous else [])


def read_secrets(session: Session, tenant_id: str, *, now: float) -> Secrets | None:
    """The tenant's secrets, or None while it has none yet (a read: no write lock)."""
    row = session.execute(sa.select(
        TENANTS.c.webhook_secret, TENANTS.c.webhook_secret_previous,
        TENANTS.c.webhook_previous_until).where(TENANTS.c.id == tenant_id)).one()
    if row.webhook_secret is None:
        return None
    until = epoch_or_none(row.webhook_previous_until)
    if row.webhook_secret_previous is None or until is None or until <= now:
        return Secrets(current=row.webhook_secret, previous=None, previous_until=None)
    return Secrets(current=row.webhook_secret, previous=row.webhook_secret_previous,
                   previous_until=until)


def secrets(session: Session, tenant_id: str, *, now: float, made: str) -> Secrets:
    """The tenant's secrets; ``made`` becomes its secret if it has none yet (the first
    writer's stays when two race)."""
    found = read_secrets(session, tenant_id, now=now)
    if found is not None:
        return found
    session.execute(sa.update(TENANTS).where(TENANTS.c.id == tenant_id,
                                             TENANTS.c.webhook_secret.is_(None))
                    .values(webhook_secret=made))
    made_or_raced = read_secrets(session, tenant_id, now=now)
    assert made_or_raced is not None
    return made_or_raced


def rotate(session: Session, tenant_id: str, *, made: str, now: float,
           previous_for_s: float) -> Secrets:
    """``made`` becomes the tenant's secret; the one it replaces signs beside it for
    ``previous_for_s``."""
    current = secrets(session, tenant_id, now=now, made=made).current
    if current == made:  # it had none: nothing to keep signing with
        return Secrets(current=made, previous=None, previous_until=None)
    until = now + previous_for_s
    session.execute(sa.update(TENANTS).where(TENANTS.c.id == tenant_id).values(
        webhook_secret=made, webhook_secret_previous=current,
        webhook_previous_until=dt(until)))
    return Secrets(current=made, previous=current, previous_until=until)
