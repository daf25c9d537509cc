"""The leader's chores, each a small service with its own period and ``run_once(now, stats)``.

The dispatcher only schedules them (``Dispatcher.run_once``): caps, reaping and expiry run
together every ``MAINTENANCE_PERIOD_S`` (and in a leader's first round); the feeder every
``FEED_PERIOD_S``; the reconciler every ``RECONCILE_PERIOD_S``; retention every
``PRUNE_PERIOD_S``, or every upkeep while a backlog remains. A chore keeps what it needs
between runs (the caps last pushed, the reconciler's cursors), so the dispatcher keeps none.

Every index write a chore makes carries the leader's fencing token, read from the dispatcher
at the moment of the write: a deposed leader's chore is refused (``NotLeader``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.orm import Session

from jobs.blobs.store import BlobStore
from jobs.core.cadence import (
    FEED_PERIOD_S,
    MAINTENANCE_PERIOD_S,
    PRUNE_PERIOD_S,
    RECONCILE_PERIOD_S,
    UNCOMMITTED_RETRY_S,
)
from jobs.core.domain import Job
from jobs.core.states import Status
from jobs.dispatch.feeder import BatchFeeder
from jobs.dispatch.rebuild import may_be_uncommitted
from jobs.dispatch.reconciler import Reconciler
from jobs.dispatch.recovery import Lapsed, check_lead, expiry_note, recover
from jobs.dispatch.retention import Retention
from jobs.dispatch.round import DispatchStats
from jobs.fleet import pool
from jobs.fleet.service_rate import ServiceRateTracker
from jobs.index import counters, notify
from jobs.index.base import IndexedJob, Lease
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from jobs.store import tenants as tenants_sql

logger = logging.getLogger("tierq.dispatcher")


class Leading(Protocol):
    """What a chore needs of the dispatcher that schedules it."""

    runtime: Runtime
    batch_size: int
    # The leader's fencing token (None: unfenced, a lone dispatcher driven by hand).
    fence: str | None
    # Renews the leader lock during long work; raises NotLeader once deposed.
    keep_lead: Callable[[], None] | None


@dataclass
class Chore:
    """A chore on its own period: due once ``period_s`` has passed since it last ran."""

    lead: Leading
    period_s: float
    last_run: float = field(default=float("-inf"), init=False)

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError(f"{type(self).__name__}.period_s must be above zero")

    def due(self, now: float) -> bool:
        return now - self.last_run >= self.period_s

    def run(self, now: float, stats: DispatchStats) -> None:
        self.last_run = now
        self.run_once(now, stats)

    def run_once(self, now: float, stats: DispatchStats) -> None:
        raise NotImplementedError


def announce(runtime: Runtime, job_ids: Iterable[str]) -> None:
    """After a commit: wake long-polls of these jobs (one PUBLISH, best effort)."""
    notify.announce(runtime.redis, runtime.prefix, job_ids)


def expire_queued(session: Session, job: Job, now: float) -> bool:
    """The one queued → expired move: the job is never computed."""
    return job.status is Status.QUEUED and jobs_sql.transition(
        session, job.id, src=Status.QUEUED, attempt=job.attempt, dst=Status.EXPIRED, now=now,
        **expiry_note(job),
    )


def lease_entry(lease: Lease) -> IndexedJob:
    """The entry a lease was taken from, to restore it as it was (its deadline included)."""
    return IndexedJob(
        job_id=lease.job_id, tenant=lease.tenant, tier=lease.tier, order_key=lease.order_key,
        start_by=lease.start_by, attempt=lease.attempt,
    )


def retry_soon(lease: Lease, now: float) -> IndexedJob:
    """Offered again shortly: a job whose row is not committed yet. Its deadline comes from
    the lease (no row to read it from): ``Expire`` ends it on time even while it waits
    behind a full pool."""
    return IndexedJob(
        job_id=lease.job_id, tenant=lease.tenant, tier=lease.tier, order_key=lease.order_key,
        start_by=lease.start_by, not_before=now + UNCOMMITTED_RETRY_S, attempt=lease.attempt,
    )


@dataclass
class Caps(Chore):
    """Tier caps from the pool's live capacity, and per-tenant overrides read from SQL at
    every run (ids and caps only), pushed to the index when they change: a tenant under a
    new cap becomes runnable, and a lowered cap holds within a period, well inside the 5 s
    docs/api.md promises for any change of a tenant. It also keeps the pool's capacity the
    dispatch fills."""

    period_s: float = MAINTENANCE_PERIOD_S
    # The pool's capacity as of the last run (None: none yet).
    capacity: int | None = field(default=None, init=False)
    _pushed: tuple[dict[str, int], dict[str, int]] | None = field(default=None, init=False)
    _service: ServiceRateTracker = field(default_factory=ServiceRateTracker, init=False)

    def run_once(self, now: float, stats: DispatchStats) -> None:
        runtime = self.lead.runtime
        figures = pool.read_pool(runtime.policy, runtime.index, now=now,
                                 measured=self._service.refresh(runtime, now))
        self.capacity = figures.capacity
        with runtime.sessions() as session:
            overrides = tenants_sql.cap_overrides(session)
        if (figures.caps, overrides) != self._pushed:
            runtime.index.set_caps(figures.caps, overrides, fence=self.lead.fence)
            self._pushed = (dict(figures.caps), overrides)

    def forget_pushed(self) -> None:
        """Push again next run, whatever the index holds (after a full pass)."""
        self._pushed = None


@dataclass
class Reap(Chore):
    """Leases that lapsed (worker died, message lost): ``jobs.dispatch.recovery`` decides
    from each job's row. Commit point: the SQL transaction. Interrupted before it, the
    leases go back (lapsed: the next run reaps them again); after it, an entry that did not
    make it into the index is found by the reconciler. The transaction first checks that SQL
    still names this leader: a successor may have restored these leases since reap.lua took
    them, and a worker started on one must not see its job re-queued under it."""

    period_s: float = MAINTENANCE_PERIOD_S

    def run_once(self, now: float, stats: DispatchStats) -> None:
        runtime, fence = self.lead.runtime, self.lead.fence
        leases = runtime.index.reap(now=now, limit=self.lead.batch_size, fence=fence)
        if not leases:
            return
        entries: list[IndexedJob] = []
        try:
            with runtime.sessions.begin() as session:
                check_lead(session, fence)
                jobs = jobs_sql.get_jobs(session, (lease.job_id for lease in leases))
                ttl = runtime.policy.lease_ttl_s
                for lease in leases:
                    entry = self._decide(session, lease, jobs.get(lease.job_id), now, stats, ttl)
                    if entry is not None:
                        entries.append(entry)
        except Exception:
            for lease in leases:  # back as they were (lapsed): the next run reaps them
                runtime.index.restore_lease(lease_entry(lease), ttl_s=0.0, now=now,
                                            fence=self.lead.fence)
            raise
        stats.reaped += len(leases)
        announce(runtime, (lease.job_id for lease in leases))
        runtime.index.requeue_many(entries, fence=self.lead.fence)
        # Counted with the round's other transitions (``Dispatcher._count``), one round trip.

    @staticmethod
    def _decide(
        session: Session, lease: Lease, job: Job | None, now: float, stats: DispatchStats,
        ttl_s: float,
    ) -> IndexedJob | None:
        """One not in SQL yet is retried while its commit may be on its way."""
        if job is None:
            return retry_soon(lease, now) if may_be_uncommitted(lease.job_id, now) else None
        outcome = recover(session, job, now, Lapsed(expires_at=lease.expires_at, ttl_s=ttl_s))
        stats.requeued += outcome.requeued
        stats.failed += outcome.failed
        stats.expired += outcome.expired
        return outcome.entry


@dataclass
class Expire(Chore):
    """Queued jobs past ``start_by`` end ``expired``, even while the pool is full. Commit
    point: the SQL transaction; the index entry went first, so an interruption leaves a
    queued row the reconciler indexes again (and the next run expires). An entry whose row
    is not visible yet is dropped: if the row lands, the reconciler indexes it and it
    expires then."""

    period_s: float = MAINTENANCE_PERIOD_S

    def run_once(self, now: float, stats: DispatchStats) -> None:
        runtime = self.lead.runtime
        due = runtime.index.expire_due(now=now, limit=self.lead.batch_size,
                                       fence=self.lead.fence)
        if not due:
            return
        try:
            with runtime.sessions.begin() as session:
                jobs = jobs_sql.get_jobs(session, (item.job_id for item in due))
                expired = [job for job in jobs.values() if expire_queued(session, job, now)]
        except Exception:
            runtime.index.requeue_many(due, fence=self.lead.fence)  # still due: next run
            raise
        announce(runtime, (job.id for job in expired))
        for job in expired:
            stats.expired += 1
            logger.info("job.expired", extra={"job_id": job.id, "tier": job.tier})


@dataclass
class Feed(Chore):
    """Waiting batch items into their tier's live queue as room allows
    (``jobs.dispatch.feeder``); the round then dispatches into what they filled."""

    period_s: float = FEED_PERIOD_S
    _feeder: BatchFeeder | None = field(default=None, init=False)

    @property
    def pending(self) -> bool:
        """Items were waiting at the last run: come back within a feed period."""
        return self._feeder is not None and self._feeder.pending

    def run_once(self, now: float, stats: DispatchStats) -> None:
        if self._feeder is None:
            self._feeder = BatchFeeder(self.lead.runtime)
        stats.fed = self._feeder.run_once(now, fence=self.lead.fence).admitted


@dataclass
class Reconcile(Chore):
    """One bounded round of ``jobs.dispatch.reconciler``, which makes the index converge to
    SQL whatever two-step change was interrupted; then the live counts for ``/metrics``."""

    period_s: float = RECONCILE_PERIOD_S
    _reconciler: Reconciler | None = field(default=None, init=False)

    @property
    def reconciler(self) -> Reconciler:
        if self._reconciler is None:
            self._reconciler = Reconciler(self.lead.runtime)
        return self._reconciler

    def run_once(self, now: float, stats: DispatchStats) -> None:
        stats.reconciled = self.reconciler.run_once(
            now, fence=self.lead.fence, keep_lead=self.lead.keep_lead
        )
        self._count_live()

    def _count_live(self) -> None:
        """Jobs in each live state, counted in SQL once a period by the leader (not by every
        scrape of every API replica) and kept in Redis for ``/metrics``."""
        runtime = self.lead.runtime
        try:
            with runtime.sessions() as session:
                live = stats_sql.count_live(session, runtime.scope)
            counters.store_live(runtime.redis, runtime.prefix,
                                {status.value: n for status, n in live.items()})
        except Exception:  # a metric must never stop dispatching
            logger.warning("counter.failed", exc_info=True, extra={"event": "counter.failed"})


@dataclass
class Prune(Chore):
    """One bounded round of ``jobs.dispatch.retention`` (SQL only, one transaction per batch:
    an interruption leaves what is due for the next run). A failure never stops
    dispatching. Due every period, and at every upkeep while a backlog remains."""

    period_s: float = PRUNE_PERIOD_S
    _retention: Retention | None = field(default=None, init=False)
    _backlog: bool = field(default=False, init=False)

    @property
    def retention(self) -> Retention:
        if self._retention is None:
            runtime = self.lead.runtime
            self._retention = Retention(runtime.sessions, runtime.policy,
                                        blobs=BlobStore.from_settings(runtime.settings))
        return self._retention

    def due(self, now: float) -> bool:
        return self._backlog or super().due(now)

    def run_once(self, now: float, stats: DispatchStats) -> None:
        try:
            stats.pruned = self.retention.run_once(now)
        except Exception:
            logger.exception("retention.failed", extra={"event": "retention.failed"})
            self._backlog = False
            return
        self._backlog = stats.pruned.more
