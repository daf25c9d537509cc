"""The dispatcher: fills free pool slots with the best runnable jobs, and keeps the index honest.

A round dispatches (4). Every ``MAINTENANCE_PERIOD_S`` a round also does the upkeep (1-3, 6 and
7) after its first dispatch, then dispatches again into what reaping freed; the first round
of a dispatcher does 1-3 before anything:

1. caps: recompute tier caps from the pool's capacity and push them to the index when they
   change (a tenant under its new cap becomes runnable); and route the pool by kind, or
   stop, as its live workers' kinds say (``jobs.dispatch.routing.Kinds``);
2. reap: leases that lapsed (worker died, message lost) are decided from each job's row
   (``jobs.dispatch.recovery``): a row still queued (a dispatch whose message never started)
   is indexed again as it is; one that moved goes back as a new attempt with its original
   order key, uncharged when it never started, or fails when its starts are spent or its
   deadline passed;
3. expire: queued jobs past ``start_by`` end ``expired`` and are never computed, even while
   the pool is full;
4. dispatch: lease as many jobs as there are free slots (never more) and publish each lease
   to its tier's broker queue (in a pool routed by kind, to the queue of its kind, or parked
   while no live worker runs it: ``jobs.dispatch.routing``), writing nothing to SQL: the
   row stays ``queued`` until the worker's start, which is the claim (``jobs_sql.start``)
   and settles what a lease can meet (a row not committed yet, cancelled, past its
   deadline) on the row it reads anyway. In
   steady state most slots are filled by the worker that frees them (``hand_over``: the
   release and the next lease in one script, its message to the worker's own queue); the
   dispatcher fills idle workers (a start-up, a burst, a slot freed with nothing to lease
   then) and does the upkeep;
5. feed, every ``FEED_PERIOD_S``: waiting batch items enter their tier's live queue as room
   allows (``jobs.dispatch.feeder``), and the round dispatches again into what they filled;
6. reconcile, every ``RECONCILE_PERIOD_S``: one bounded round of ``jobs.dispatch.reconciler``,
   which makes the index converge to SQL whatever two-step change was interrupted;
7. prune, every ``PRUNE_PERIOD_S`` (every upkeep while a backlog remains): one bounded round
   of ``jobs.dispatch.retention``, deleting finished jobs past their tier's retention.

Each chore but the dispatch (1-3, 5-7) is a small service of ``jobs.dispatch.upkeep`` with
its own period; the dispatcher only schedules them. ``jobs.dispatch.loop`` runs ``run_once``
and sleeps on the doorbell (``jobs.index.wake``) between rounds, so a submit or a slot
released with no hand-over is acted on at once, with no polling delay on the hot path.

Several dispatchers may run: one leads (``jobs.dispatch.leadership``), the others stand by. The
leader passes its fencing token to every index write it makes (dispatch, put back, reap,
expire, caps, requeue, release, rebuild), which refuse it once another process leads
(``NotLeader``: it steps down at once). Before its first round, and whenever the index's epoch
is gone (Redis flushed or restarted empty), the leader makes a full pass
(``jobs.dispatch.rebuild``), renewing its lock between batches: leases of running jobs come
back before anything more is dispatched, so no tenant goes over its cap. An index restored
from an older snapshot shows an epoch other than the one the leader last wrote, and is
rebuilt the same way before the next round (the reconciler's epoch check catches it too, for
a leader that wrote none yet).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from jobs.core.cadence import PUBLISH_RETRY_S, UNCOMMITTED_GRACE_S, UNCOMMITTED_RETRY_S
from jobs.dispatch.reconciler import Reconciler
from jobs.dispatch.retention import Retention
from jobs.dispatch.round import DispatchStats
from jobs.dispatch.routing import PARKED_S, ROUTED_PASSES, Kinds, Send, route
from jobs.dispatch.upkeep import (
    Caps,
    Expire,
    Feed,
    Prune,
    Reap,
    Reconcile,
)
from jobs.index import counters
from jobs.index.base import Lease
from jobs.process.runtime import Runtime
from jobs.store import upkeep as upkeep_sql

logger = logging.getLogger("tierq.dispatcher")

__all__ = ["UNCOMMITTED_GRACE_S", "DispatchStats", "Dispatcher", "Publisher"]


class Publisher(Protocol):
    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None,
        kind: str | None = None,
    ) -> None:
        """To ``tier``'s queue; with a ``kind``, to that kind's queue instead, which only the
        workers that run it consume (a pool routed by kind: ``jobs.dispatch.routing``)."""
        ...


@dataclass
class Dispatcher:
    runtime: Runtime
    publisher: Publisher
    batch_size: int = 200
    # Runs retention (``jobs.dispatch.retention``), which is fleet-wide: one pool's
    # dispatcher only (``jobs.dispatch.pools``).
    prunes: bool = True
    # The leader's fencing token, passed to every index write it makes; None: unfenced (a
    # lone dispatcher driven by hand, as in tests).
    fence: str | None = field(default=None, init=False)
    # Renews the leader lock during long work (a full pass); raises NotLeader once deposed.
    keep_lead: Callable[[], None] | None = field(default=None, init=False)
    # The token this process last wrote to SQL's ``leadership`` row (``_claim_lead``).
    _claimed: str | None = field(default=None, init=False)
    _rebuilt: bool = field(default=False, init=False)
    # The chores (``jobs.dispatch.upkeep``), each on its own period.
    caps: Caps = field(init=False)
    reap: Reap = field(init=False)
    expire: Expire = field(init=False)
    feed: Feed = field(init=False)
    reconcile: Reconcile = field(init=False)
    prune: Prune = field(init=False)
    kinds: Kinds = field(init=False)

    def __post_init__(self) -> None:
        self.caps, self.reap, self.expire = Caps(self), Reap(self), Expire(self)
        self.feed, self.reconcile, self.prune = Feed(self), Reconcile(self), Prune(self)
        self.kinds = Kinds(self)

    @property
    def prefixes(self) -> list[str]:
        """The doorbells this dispatcher answers (``jobs.index.wake``)."""
        return [self.runtime.prefix]

    @property
    def reconciler(self) -> Reconciler:
        return self.reconcile.reconciler

    @property
    def retention(self) -> Retention:
        return self.prune.retention

    def run_once(self, now: float, *, maintain: bool = True) -> DispatchStats:
        """One round. ``maintain=False`` (a doorbell's round) only dispatches (and feeds when
        due), with the capacity of the last upkeep: caps, reaping, expiry, the reconciler
        and retention run on their own period, not once per ring."""
        stats = DispatchStats()
        self._claim_lead()
        if self.caps.capacity is None:  # the first round: caps and capacity before anything
            self._upkeep(now, stats)
        elif maintain:
            # What woke the round is served before the upkeep (a leased job past its
            # deadline expires at its start); the pass after it fills what reaping freed.
            self._dispatch_free(now, stats)
            self._upkeep(now, stats)
        self._dispatch_free(now, stats)
        if self.feed.due(now):
            self.feed.run(now, stats)
            if stats.fed:
                self._dispatch_free(now, stats)
        stats.feed_pending = self.feed.pending
        if maintain:
            for chore in (self.reconcile, self.prune):
                if chore is self.prune and not self.prunes:
                    continue
                if chore.due(now):
                    chore.run(now, stats)
        self._count(stats)
        return stats

    def _upkeep(self, now: float, stats: DispatchStats) -> None:
        for chore in (self.caps, self.reap, self.expire, self.kinds):
            chore.run(now, stats)

    def maintenance_due(self, now: float) -> bool:
        return self.caps.capacity is None or self.caps.due(now)

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
            self.runtime.redis, self.runtime.prefix,
            jobs={"expired": stats.expired, "failed": stats.failed},
            repairs=repairs,
            reclaimed=stats.reaped,
        )

    def _dispatch_free(self, now: float, stats: DispatchStats) -> None:
        """Fill the free slots: the index counts them in the same call (``capacity``, cut
        there to the live workers' slots: a configured capacity that admits work before any
        worker of the pool is live leases none of it, so none of it lapses, out of order)."""
        assert self.caps.capacity is not None
        if self.caps.capacity == 0:  # no worker at the last upkeep: one may have come since
            self.caps.capacity = self.runtime.policy.pool_concurrency or (
                self.runtime.index.pool_capacity(now=now))
        if self.caps.capacity > 0:
            for _ in range(ROUTED_PASSES):  # again into the slots of jobs just parked
                parked = stats.parked
                self._dispatch(now, stats)
                if stats.parked == parked:
                    break

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
        first (and is read) or is refused (``upkeep_sql.holds_lead``). A former leader
        stalled inside such a decision holds the row: the claim then gives up after a third
        of the leader TTL (``lock_timeout``) and is made again next turn, nothing read or
        written meanwhile, until the server ends the stalled transaction."""
        if self.fence is None or self.fence == self._claimed:
            return
        with self.runtime.sessions.begin() as session:
            upkeep_sql.claim_lead(session, self.fence)
        self._claimed = self.fence

    def rebuild(self, now: float) -> None:
        """The reconciler's full pass (at leadership, or once Redis lost its data)."""
        self._claim_lead()
        self.reconciler.full_pass(now, fence=self.fence, keep_lead=self.keep_lead)
        counters.count(self.runtime.redis, self.runtime.prefix,
                       repairs={"full_pass": 1})
        self._rebuilt = True
        self.reconcile.last_run = now
        self.caps.forget_pushed()  # pushed again next round, whatever the index held

    # -- dispatch --------------------------------------------------------------------------

    def _dispatch(self, now: float, stats: DispatchStats) -> None:
        """Lease, publish: nothing is written to SQL. The lease is the claim, and the
        worker's start moves the row from queued (``jobs_sql.start``), settling there what a
        lease can meet: a row not committed yet, cancelled, or past its deadline.
        Interrupted after the lease and before the publish: the lease lapses while the row
        is queued, and the reaper indexes it again."""
        leases, routed = self.runtime.index.dispatch_routed(
            self.batch_size, now=now, lease_ttl_s=self.runtime.policy.lease_ttl_s,
            fence=self.fence, capacity=self.caps.capacity,
        )
        stats.batch_full = stats.batch_full or len(leases) >= self.batch_size
        sends = [Send(lease) for lease in leases]
        if routed:  # not every live worker runs every kind: each job by its kind
            found = route(self.runtime, leases, now)
            sends = found.sends
            self._park(found.parked, now, stats)
            for lease in found.unread:  # its kind is read once its submit has committed
                self.runtime.index.put_back(lease.job_id, attempt=lease.attempt,
                                            not_before=now + UNCOMMITTED_RETRY_S,
                                            fence=self.fence)
        done = 0
        for i, send in enumerate(sends):
            if not self._publish(send, now, stats):
                # The broker is likely down: hand this job and the rest back at once.
                self._hand_back([s.lease for s in sends[i:]], now, stats)
                break
            done += 1
        if done:  # one line a round, however many jobs it dispatched
            logger.info("jobs.dispatched", extra={
                "event": "jobs.dispatched", "count": done,
                "jobs": ",".join(f"{s.lease.job_id}:{s.lease.attempt}" for s in sends[:done]),
            })

    def _park(self, parked: list[tuple[Lease, str]], now: float, stats: DispatchStats) -> None:
        """Jobs of a kind no live worker runs: back in their places, delayed, until a worker
        of their kind registers (``jobs.dispatch.routing``). One not parked (Redis failed)
        keeps its lease, which lapses and is reaped: indexed again as it is."""
        for lease, kind in parked:
            if self.runtime.index.park(lease.job_id, attempt=lease.attempt, kind=kind,
                                       until=now + PARKED_S, fence=self.fence):
                stats.parked += 1
        if parked:
            logger.info("jobs.parked", extra={
                "event": "jobs.parked", "count": len(parked),
                "kinds": ",".join(sorted({kind for _, kind in parked})),
            })

    def _publish(self, send: Send, now: float, stats: DispatchStats) -> bool:
        lease = send.lease
        try:
            if send.kind is None:
                self.publisher.publish(lease.job_id, lease.attempt, lease.tier,
                                       dispatched_at=now)
            else:
                self.publisher.publish(lease.job_id, lease.attempt, lease.tier,
                                       dispatched_at=now, kind=send.kind)
        except Exception:
            logger.exception("job.publish_failed",
                             extra={"job_id": lease.job_id, "tier": lease.tier})
            return False
        stats.dispatched += 1
        return True

    def _hand_back(self, leases: list[Lease], now: float, stats: DispatchStats) -> None:
        """Put unpublished jobs back in the queue, due again after a short backoff, their
        place kept (a message may have left after all: its start and the next dispatch's
        meet in the start's compare-and-set, and one runs). If this fails too, the leases
        lapse and the reaper indexes the jobs again."""
        stats.publish_failed += len(leases)
        for lease in leases:
            self.runtime.index.put_back(lease.job_id, attempt=lease.attempt,
                                        not_before=now + PUBLISH_RETRY_S, fence=self.fence)
