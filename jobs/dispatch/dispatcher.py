"""The dispatcher: fills free pool slots with the best runnable jobs, and keeps the index honest.

A round dispatches (4). Every ``MAINTENANCE_PERIOD_S`` a round also does the upkeep (1-3, 6 and
7) after its first dispatch, then dispatches again into what reaping freed; the first round
of a dispatcher does 1-3 before anything:

1. caps: recompute tier caps from the pool's capacity and push them to the index when they
   change (a tenant under its new cap becomes runnable);
2. reap: leases that lapsed (worker died, message lost) are decided from each job's row
   (``jobs.dispatch.recovery``): back in the queue as a new attempt with its original order key,
   uncharged when it never started, or failed when its starts are spent or its deadline
   passed;
3. expire: queued jobs past ``start_by`` end ``expired`` and are never computed, even while
   the pool is full;
4. dispatch: pop as many jobs as there are free slots (never more), mark them ``dispatched``
   in one statement and publish each to its tier's broker queue;
5. feed, every ``FEED_PERIOD_S``: waiting batch items enter their tier's live queue as room
   allows (``jobs.dispatch.feeder``), and the round dispatches again into what they filled;
6. reconcile, every ``RECONCILE_PERIOD_S``: one bounded round of ``jobs.dispatch.reconciler``, which
   makes the index converge to SQL whatever two-step change was interrupted;
7. prune, every ``PRUNE_PERIOD_S`` (every upkeep while a backlog remains): one bounded round
   of ``jobs.dispatch.retention``, deleting finished jobs past their tier's retention.

``jobs.dispatch.loop`` runs ``run_once`` and sleeps on the doorbell (``jobs.index.wake``)
between rounds, so a submit or a released slot is acted on at once, with no polling delay on
the hot path.

Several dispatchers may run: one leads (``jobs.dispatch.leadership``), the others stand by. The
leader passes its fencing token to every index write it makes (dispatch, reap, expire, caps,
requeue, release, rebuild), which refuse it once another process leads (``NotLeader``: it
steps down at once). Before its first round, and whenever the index's epoch is gone (Redis
flushed or restarted empty), the leader makes a full pass (``jobs.dispatch.rebuild``), renewing its
lock between batches: leases of in-flight jobs come back before anything more is
dispatched, so no tenant goes over its cap. An index restored from an older snapshot shows
an epoch other than the one the leader last wrote, and is rebuilt the same way before the
next round (the reconciler's epoch check catches it too, for a leader that wrote none yet).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.orm import Session

from jobs.blobs.store import BlobStore
from jobs.core.domain import Job
from jobs.core.states import Status
from jobs.dispatch.feeder import FEED_PERIOD_S, BatchFeeder
from jobs.dispatch.rebuild import UNCOMMITTED_GRACE_S, may_be_uncommitted
from jobs.dispatch.reconciler import RECONCILE_PERIOD_S, Reconciler, ReconcileStats
from jobs.dispatch.recovery import check_lead, expiry_note, recover
from jobs.dispatch.retention import PRUNE_PERIOD_S, PruneStats, Retention
from jobs.fleet import pool
from jobs.fleet.service_rate import ServiceRateTracker
from jobs.index import counters, notify
from jobs.index.base import IndexedJob, Lease
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from jobs.store import tenants as tenants_sql
from jobs.store import upkeep as upkeep_sql
from jobs.store.jobs import Claimed

logger = logging.getLogger("tierq.dispatcher")

__all__ = ["UNCOMMITTED_GRACE_S", "DispatchStats", "Dispatcher", "Publisher"]

# A job indexed by an API process whose SQL commit has not landed yet is retried this often
# for ``UNCOMMITTED_GRACE_S`` (``jobs.dispatch.rebuild``); after that it is a failed submit's
# leftover.
UNCOMMITTED_RETRY_S = 0.2
# A job whose publish failed (broker unreachable) is offered again after this long.
PUBLISH_RETRY_S = 1.0
# How often per-tenant cap overrides are re-read from SQL.
OVERRIDES_REFRESH_S = 10.0
MAINTENANCE_PERIOD_S = 1.0


class Publisher(Protocol):
    def publish(self, job_id: str, attempt: int, tier: str) -> None: ...


@dataclass
class DispatchStats:
    dispatched: int = 0
    expired: int = 0
    reaped: int = 0
    requeued: int = 0
    failed: int = 0
    dropped: int = 0
    # A dispatch call filled its whole batch: more may be runnable right away.
    batch_full: bool = False
    # Jobs whose publish failed (or that were not tried after a failure): handed back.
    publish_failed: int = 0
    # The round rebuilt the index from SQL instead (see ``lead_once``).
    rebuilt: bool = False
    # The reconciler's round, when one ran.
    reconciled: ReconcileStats | None = None
    # The retention round, when one ran.
    pruned: PruneStats | None = None
    # Batch items the feeder admitted to the live queue this round.
    fed: int = 0
    # Batch items are waiting: the next round should come within ``FEED_PERIOD_S``.
    feed_pending: bool = False

    @property
    def saturated(self) -> bool:
        """There may be more to do right away (otherwise a release or submit rings)."""
        return self.batch_full


@dataclass
class Dispatcher:
    runtime: Runtime
    publisher: Publisher
    batch_size: int = 200
    _caps: tuple[dict[str, int], dict[str, int]] | None = field(default=None, init=False)
    _overrides: dict[str, int] = field(default_factory=dict, init=False)
    _overrides_read_at: float = field(default=float("-inf"), init=False)
    _service: ServiceRateTracker = field(default_factory=ServiceRateTracker, init=False)
    # The leader's fencing token, passed to every index write it makes; None: unfenced (a
    # lone dispatcher driven by hand, as in tests).
    fence: str | None = field(default=None, init=False)
    # Renews the leader lock during long work (a full pass); raises NotLeader once deposed.
    keep_lead: Callable[[], None] | None = field(default=None, init=False)
    # The token this process last wrote to SQL's ``leadership`` row (``_claim_lead``).
    _claimed: str | None = field(default=None, init=False)
    _rebuilt: bool = field(default=False, init=False)
    _reconciler: Reconciler | None = field(default=None, init=False)
    _reconciled_at: float = field(default=float("-inf"), init=False)
    # The pool's capacity as of the last maintenance (None: none yet).
    _capacity: int | None = field(default=None, init=False)
    _maintained_at: float = field(default=float("-inf"), init=False)
    _retention: Retention | None = field(default=None, init=False)
    _pruned_at: float = field(default=float("-inf"), init=False)
    _prune_backlog: bool = field(default=False, init=False)

    @property
    def retention(self) -> Retention:
        if self._retention is None:
            self._retention = Retention(self.runtime.sessions, self.runtime.policy,
                                        blobs=BlobStore.from_settings(self.runtime.settings))
        return self._retention
    _feeder: BatchFeeder | None = field(default=None, init=False)
    _fed_at: float = field(default=float("-inf"), init=False)

    @property
    def reconciler(self) -> Reconciler:
        if self._reconciler is None:
            self._reconciler = Reconciler(self.runtime)
        return self._reconciler

    def run_once(self, now: float, *, maintain: bool = True) -> DispatchStats:
        """One round. ``maintain=False`` (a doorbell's round) only dispatches, with the
        capacity of the last maintenance: caps, reaping, expiry and the reconciler run on
        their own period, not once per ring."""
        stats = DispatchStats()
        self._claim_lead()
        if self._capacity is None:  # the first round: caps and capacity before anything
            self._maintain(now, stats)
        elif maintain:
            # What woke the round is served before the upkeep (a popped job past its
            # deadline expires at the claim); the pass after it fills what reaping freed.
            self._dispatch_free(now, stats)
            self._maintain(now, stats)
        self._dispatch_free(now, stats)
        if now - self._fed_at >= FEED_PERIOD_S:
            self._feed(now, stats)
        stats.feed_pending = self._feeder is not None and self._feeder.pending
        if maintain and now - self._reconciled_at >= RECONCILE_PERIOD_S:
            self._reconciled_at = now
            stats.reconciled = self.reconciler.run_once(
                now, fence=self.fence, keep_lead=self.keep_lead
            )
            self._count_live()
        if maintain and (self._prune_backlog or now - self._pruned_at >= PRUNE_PERIOD_S):
            self._prune(now, stats)
        self._count(stats)
        return stats

    def _count_live(self) -> None:
        """Jobs in each live state, counted in SQL once a reconciler period by the leader
        (not by every scrape of every API replica) and kept in Redis for ``/metrics``."""
        try:
            with self.runtime.sessions() as session:
                live = stats_sql.count_live(session)
            counters.store_live(self.runtime.redis, self.runtime.settings.key_prefix,
                                {status.value: n for status, n in live.items()})
        except Exception:  # a metric must never stop dispatching
            logger.warning("counter.failed", exc_info=True, extra={"event": "counter.failed"})

    def _count(self, stats: DispatchStats) -> None:
        """What the round's upkeep committed (expired, failed, reclaimed, repaired) in the
        fleet-wide counters (``jobs.index.counters``): one pipelined round trip for the round,
        none when it changed nothing (a dispatch is counted by the dispatch script itself,
        so the hot path pays nothing); best effort."""
        repairs: dict[str, int] = {}
        if stats.reconciled is not None:
            found = stats.reconciled
            repairs = {"full_pass": int(found.full), "orphan_recovered": found.orphans_recovered,
                       "reindexed": found.reindexed, "entry_removed": found.removed}
        counters.count(
            self.runtime.redis, self.runtime.settings.key_prefix,
            jobs={"expired": stats.expired, "failed": stats.failed},
            repairs=repairs,
            reclaimed=stats.reaped,
        )

    def _prune(self, now: float, stats: DispatchStats) -> None:
        """One bounded retention round (SQL only, one transaction per batch: an interruption
        leaves what is due for the next round). A failure never stops dispatching."""
        self._pruned_at = now
        try:
            stats.pruned = self.retention.run_once(now)
        except Exception:
            logger.exception("retention.failed", extra={"event": "retention.failed"})
            self._prune_backlog = False
            return
        self._prune_backlog = stats.pruned.more

    def _dispatch_free(self, now: float, stats: DispatchStats) -> None:
        """Fill the free slots: the index counts them in the same call (``capacity``)."""
        assert self._capacity is not None
        if self._capacity == 0:  # no worker at the last upkeep: one may have come since
            self._capacity = self.runtime.policy.pool_concurrency or (
                self.runtime.index.pool_capacity(now=now))
        if self._capacity > 0:
            self._dispatch(now, stats)

    def _feed(self, now: float, stats: DispatchStats) -> None:
        """Waiting batch items into the live queue; a dispatch then fills slots with them."""
        if self._feeder is None:
            self._feeder = BatchFeeder(self.runtime)
        self._fed_at = now
        stats.fed = self._feeder.run_once(now).admitted
        if stats.fed:
            self._dispatch_free(now, stats)

    def maintenance_due(self, now: float) -> bool:
        return self._capacity is None or now - self._maintained_at >= MAINTENANCE_PERIOD_S

    def _maintain(self, now: float, stats: DispatchStats) -> None:
        figures = pool.read_pool(self.runtime.policy, self.runtime.index, now=now,
                                     measured=self._service.refresh(self.runtime, now))
        self._capacity = figures.capacity
        self._push_caps(figures.caps, now)
        self._reap(now, stats)
        self._expire(now, stats)
        self._maintained_at = now

    def needs_rebuild(self) -> bool:
        """Not rebuilt by this process yet, or the index lost its data since, or came back
        from an older snapshot (its epoch is not the one this leader last wrote): checked
        before every round, so no lease a snapshot lacks lets a tenant over its cap."""
        if not self._rebuilt:
            return True
        found = self.runtime.index.generation()
        written = self.reconciler.written
        return found is None or (written is not None and found != written)

    def _claim_lead(self) -> None:
        """A new leader names itself in SQL before it reads anything there to restore leases
        from: a deposed leader's reaping decision still in flight then either committed
        first (and is read) or is refused (``upkeep_sql.holds_lead``)."""
        if self.fence is None or self.fence == self._claimed:
            return
        with self.runtime.sessions.begin() as session:
            upkeep_sql.claim_lead(session, self.fence)
        self._claimed = self.fence

    def rebuild(self, now: float) -> None:
        """The reconciler's full pass (at leadership, or once Redis lost its data)."""
        self._claim_lead()
        self.reconciler.full_pass(now, fence=self.fence, keep_lead=self.keep_lead)
        counters.count(self.runtime.redis, self.runtime.settings.key_prefix,
                       repairs={"full_pass": 1})
        self._rebuilt = True
        self._reconciled_at = now
        self._caps = None  # pushed again next round, whatever the index held

    def _announce(self, job_ids: Iterable[str]) -> None:
        """After a commit: wake long-polls of these jobs (one PUBLISH, best effort)."""
        notify.announce(self.runtime.redis, self.runtime.settings.key_prefix, job_ids)

    # -- caps ------------------------------------------------------------------------------

    def _push_caps(self, tier_caps: dict[str, int], now: float) -> None:
        if now - self._overrides_read_at >= OVERRIDES_REFRESH_S:
            with self.runtime.sessions() as session:
                tenants = tenants_sql.list_tenants(session)
            self._overrides = {t.id: t.cap for t in tenants if t.cap is not None}
            self._overrides_read_at = now
        caps = (tier_caps, self._overrides)
        if caps != self._caps:
            self.runtime.index.set_caps(tier_caps, self._overrides, fence=self.fence)
            self._caps = (dict(tier_caps), dict(self._overrides))

    # -- reap and expire -------------------------------------------------------------------

    def _reap(self, now: float, stats: DispatchStats) -> None:
        """Leases that lapsed: ``jobs.dispatch.recovery`` decides from each job's row. Commit point:
        the SQL transaction. Interrupted before it, the leases go back (lapsed: the next
        round reaps them again); after it, an entry that did not make it into the index is
        found by the reconciler (a queued row not indexed, or an in-flight one without a
        lease). The transaction first checks that SQL still names this leader: a successor
        may have restored these leases since reap.lua took them, and a worker started on
        one must not see its job re-queued under it."""
        index = self.runtime.index
        leases = index.reap(now=now, limit=self.batch_size, fence=self.fence)
        if not leases:
            return
        entries: list[IndexedJob] = []
        try:
            with self.runtime.sessions.begin() as session:
                check_lead(session, self.fence)
                jobs = jobs_sql.get_jobs(session, (lease.job_id for lease in leases))
                for lease in leases:
                    entry = self._recover(session, lease, jobs.get(lease.job_id), now, stats)
                    if entry is not None:
                        entries.append(entry)
        except Exception:
            for lease in leases:  # back as they were (lapsed): the next round reaps them
                index.restore_lease(_entry(lease), ttl_s=0.0, now=now, fence=self.fence)
            raise
        stats.reaped += len(leases)
        self._announce(lease.job_id for lease in leases)
        index.requeue_many(entries, fence=self.fence)
        # Counted with the round's other transitions (``_count``), one round trip.

    def _recover(
        self, session: Session, lease: Lease, job: Job | None, now: float, stats: DispatchStats
    ) -> IndexedJob | None:
        """A lease lapsed: the job's row decides (``jobs.dispatch.recovery``). One not in SQL yet is
        retried while its commit may be on its way."""
        if job is None:
            return _retry_soon(lease, now) if may_be_uncommitted(lease.job_id, now) else None
        outcome = recover(session, job, now)
        stats.requeued += outcome.requeued
        stats.failed += outcome.failed
        stats.expired += outcome.expired
        return outcome.entry

    def _expire(self, now: float, stats: DispatchStats) -> None:
        """Queued jobs past ``start_by``. Commit point: the SQL transaction; the index entry
        went first, so an interruption leaves a queued row the reconciler indexes again (and
        the next round expires). An entry whose row is not visible yet is dropped: if the
        row lands, the reconciler indexes it and it expires then."""
        due = self.runtime.index.expire_due(now=now, limit=self.batch_size, fence=self.fence)
        if not due:
            return
        try:
            with self.runtime.sessions.begin() as session:
                jobs = jobs_sql.get_jobs(session, (item.job_id for item in due))
                expired = [job for job in jobs.values() if self._expire_one(session, job, now)]
        except Exception:
            # still due: the next round tries again
            self.runtime.index.requeue_many(due, fence=self.fence)
            raise
        self._announce(job.id for job in expired)
        for job in expired:
            stats.expired += 1
            logger.info("job.expired", extra={"job_id": job.id, "tier": job.tier})

    @staticmethod
    def _expire_one(session: Session, job: Job, now: float) -> bool:
        return job.status is Status.QUEUED and jobs_sql.transition(
            session, job.id, src=Status.QUEUED, attempt=job.attempt, dst=Status.EXPIRED, now=now,
            **expiry_note(job),
        )

    # -- dispatch --------------------------------------------------------------------------

    def _dispatch(self, now: float, stats: DispatchStats) -> None:
        """Lease, claim (SQL, the commit point: one statement for the whole batch), publish.
        Interrupted after the lease and before the claim: the row is queued and the lease
        lapses; the reaper indexes it again. After the claim and before the publish: the
        lease lapses while dispatched; the reaper re-queues it, uncharged."""
        ttl = self.runtime.policy.lease_ttl_s
        index = self.runtime.index
        leases = index.dispatch(
            self.batch_size, now=now, lease_ttl_s=ttl, fence=self.fence, capacity=self._capacity
        )
        stats.batch_full = stats.batch_full or len(leases) >= self.batch_size
        if not leases:
            return
        retry_later: list[Lease] = []
        drop: list[Lease] = []
        with self.runtime.sessions.begin() as session:
            claimed = jobs_sql.claim(session, [lease.job_id for lease in leases], now=now)
            rest = [lease for lease in leases if lease.job_id not in claimed]
            jobs = jobs_sql.get_jobs(session, (lease.job_id for lease in rest))
            for lease in rest:  # not queued, past its deadline, or not committed yet
                job = jobs.get(lease.job_id)
                if job is None:
                    young = may_be_uncommitted(lease.job_id, now)
                    (retry_later if young else drop).append(lease)
                elif self._expire_late(session, job, now, stats):
                    drop.append(lease)
                elif job.status is Status.QUEUED:
                    # Its INSERT committed after the claim's statement read (READ
                    # COMMITTED): offer it again, not drop it (its entry would be lost
                    # until the reconciler's grace).
                    retry_later.append(lease)
                elif job.status is not Status.DISPATCHED and job.status is not Status.RUNNING:
                    drop.append(lease)
        self._announce([*claimed, *jobs])  # claimed, or expired at the claim
        for lease in drop:
            index.release(lease.job_id, attempt=lease.attempt, fence=self.fence)
            stats.dropped += 1
        for lease in retry_later:
            index.release(lease.job_id, attempt=lease.attempt, fence=self.fence)
            index.requeue(_retry_soon(lease, now), fence=self.fence)
        to_publish = [claimed[lease.job_id] for lease in leases if lease.job_id in claimed]
        for lease in leases:
            won = claimed.get(lease.job_id)
            if won is not None and won.attempt != lease.attempt:
                # the index held a stale attempt: the lease is the row's attempt's now
                index.restore_lease(_claimed_entry(won), ttl_s=ttl, now=now, fence=self.fence)
        for i, item in enumerate(to_publish):
            if not self._publish(item, stats):
                # The broker is likely down: hand this job and the rest back at once.
                self._hand_back(to_publish[i:], now, stats)
                break
        if stats.dispatched:  # one line a round, however many jobs it dispatched
            sent = to_publish[: stats.dispatched]
            logger.info("jobs.dispatched", extra={
                "event": "jobs.dispatched", "count": len(sent),
                "jobs": ",".join(f"{job.id}:{job.attempt}" for job in sent),
            })

    @staticmethod
    def _expire_late(session: Session, job: Job, now: float, stats: DispatchStats) -> bool:
        """A queued job popped past its ``start_by`` expires instead of running."""
        if job.status is not Status.QUEUED or job.start_by is None or now < job.start_by:
            return False
        if jobs_sql.transition(
            session, job.id, src=Status.QUEUED, attempt=job.attempt, dst=Status.EXPIRED,
            now=now, **expiry_note(job),
        ):
            stats.expired += 1
        return True

    def _publish(self, job: Claimed, stats: DispatchStats) -> bool:
        try:
            self.publisher.publish(job.id, job.attempt, job.tier)
        except Exception:
            logger.exception("job.publish_failed", extra={"job_id": job.id, "tier": job.tier})
            return False
        stats.dispatched += 1
        return True

    def _hand_back(self, jobs: list[Claimed], now: float, stats: DispatchStats) -> None:
        """Return unpublished jobs to the queue after a short backoff: a new attempt (a
        message may have left after all: the CAS makes it stale), not charged (it never
        started). If this fails too, the lease lapses and the reaper re-queues them."""
        stats.publish_failed += len(jobs)
        not_before = now + PUBLISH_RETRY_S
        with self.runtime.sessions.begin() as session:
            handed = [
                job
                for job in jobs
                if jobs_sql.transition(
                    session, job.id, src=Status.DISPATCHED, attempt=job.attempt,
                    dst=Status.QUEUED, now=now, not_before=not_before,
                )
            ]
        self._announce(job.id for job in handed)
        self.runtime.index.requeue_many(
            [_claimed_entry(job, not_before, attempt=job.attempt + 1) for job in handed],
            fence=self.fence,
        )


def _entry(lease: Lease) -> IndexedJob:
    return IndexedJob(
        job_id=lease.job_id, tenant=lease.tenant, tier=lease.tier, order_key=lease.order_key,
        attempt=lease.attempt,
    )


def _claimed_entry(
    job: Claimed, not_before: float | None = None, *, attempt: int | None = None
) -> IndexedJob:
    return IndexedJob(
        job_id=job.id, tenant=job.tenant_id, tier=job.tier, order_key=job.order_key,
        start_by=job.start_by, not_before=not_before,
        attempt=job.attempt if attempt is None else attempt,
    )


def _retry_soon(lease: Lease, now: float) -> IndexedJob:
    return IndexedJob(
        job_id=lease.job_id,
        tenant=lease.tenant,
        tier=lease.tier,
        order_key=lease.order_key,
        not_before=now + UNCOMMITTED_RETRY_S,
        attempt=lease.attempt,
    )
