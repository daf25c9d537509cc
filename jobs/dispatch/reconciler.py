"""The reconciler: the dispatch index converges to SQL all the time, not only at leadership.

Every change that spans SQL and Redis is two steps, and either can be interrupted after the
other succeeded (a crash, a Redis or SQL error, a deposed leader). The steps are ordered so
that what an interruption leaves is one of a few states this loop recognises and repairs
(``docs/states.md`` names the commit point of each transition). The leader runs
``run_once`` every ``RECONCILE_PERIOD_S``, fenced with its token; each round is bounded:

1. **epoch**: SQL and Redis hold the same epoch, advanced every round (SQL first). A Redis
   that lost its data has none; one restored from an older snapshot has an older one. Either
   way the round is a full pass instead (``jobs.dispatch.rebuild``), and the epochs agree again.
2. **in flight without a lease**: running rows, and dispatched ones of earlier versions (few:
   at most the pool's slots, plus what needs repair), walked by id, ``IN_FLIGHT_BATCH`` a
   round, whose attempt holds no lease — the lease was reaped while the row moved, or lost
   with Redis — are decided as a lapsed lease is (``jobs.dispatch.recovery``); a running row
   started less than half a lease TTL ago is left to a later round, since its worker may be
   handing it back uncharged right now. A running row with a cancel request gets its lease
   flagged (``flag_cancel``), in case the API was interrupted between its commit and its
   flag: the worker learns of the cancel with its next renewal.
3. **queued but not indexed**: queued rows whose last change settled more than
   ``QUEUED_GRACE_S`` ago, walked by ``(updated_at, id)`` from a cursor, ``QUEUED_BATCH`` a
   round, that the index does not hold at their attempt are indexed again. A leased one
   counts as held: a dispatch writes nothing to SQL, so a queued row whose message is on its
   way holds a lease, which the reaper decides if it lapses. The walk starts over from the
   oldest every ``FULL_SWEEP_S``, so a row whose commit landed late is found.
4. **entries without a live row**: the index's entries, walked with a cursor,
   ``ENTRY_BATCH`` a round; an entry whose row is terminal, or absent past the grace of an
   uncommitted submit, is removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from jobs.core.cadence import (
    ENTRY_BATCH,
    FULL_SWEEP_S,
    IN_FLIGHT_BATCH,
    QUEUED_BATCH,
    QUEUED_GRACE_S,
)
from jobs.core.domain import Job
from jobs.core.states import Status
from jobs.dispatch.rebuild import IN_FLIGHT, RebuildStats, may_be_uncommitted, rebuild
from jobs.dispatch.recovery import check_lead, indexed, recover
from jobs.index.base import Entry, IndexedJob
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import upkeep as upkeep_sql

logger = logging.getLogger("tierq.reconciler")



@dataclass
class ReconcileStats:
    # The round was a full pass (first round, index lost its data or is from an old snapshot).
    full: bool = False
    # In-flight rows whose attempt held no lease: re-queued, failed or expired.
    orphans_recovered: int = 0
    # Queued rows the index did not hold: indexed again.
    reindexed: int = 0
    # Index entries of terminal or absent rows: removed.
    removed: int = 0

    @property
    def repairs(self) -> int:
        return self.orphans_recovered + self.reindexed + self.removed


@dataclass
class Reconciler:
    runtime: Runtime
    _queued_cursor: tuple[float, str] | None = field(default=None, init=False)
    _sweep_started: float = field(default=float("-inf"), init=False)
    _flight_cursor: str = field(default="", init=False)
    _entry_cursor: int = field(default=0, init=False)
    # The epoch this process last wrote to the index: an index that shows another one came
    # back from an older snapshot (or was changed by ``tierq repair``) since.
    written: str | None = field(default=None, init=False)

    def run_once(
        self,
        now: float,
        *,
        fence: str | None = None,
        keep_lead: Callable[[], None] | None = None,
    ) -> ReconcileStats:
        stats = ReconcileStats()
        if self._epoch_is_stale():
            self.full_pass(now, fence=fence, keep_lead=keep_lead)
            stats.full = True
            return stats
        self._in_flight(now, fence, stats)
        self._queued(now, fence, stats)
        self._entries(now, fence, stats)
        if stats.repairs:
            logger.warning("index.repaired", extra={"event": "index.repaired", **asdict(stats)})
        return stats

    def full_pass(
        self, now: float, *, fence: str | None = None, keep_lead: Callable[[], None] | None = None
    ) -> RebuildStats:
        """Rebuild from SQL, then make the epochs agree (SQL first: an interruption between
        the two leaves them different, and the next round passes in full again)."""
        with self.runtime.sessions.begin() as session:
            before = upkeep_sql.index_epoch(session, self.runtime.pool)
        found = self.runtime.index.generation()
        if found is not None and found != str(before):
            # From an older snapshot: leases of jobs started since are missing. Until the
            # pass has put them back, the fast paths (offer, hand_over) lease nothing.
            self.runtime.index.set_generation(None, fence=fence)
        if keep_lead is None:
            stats = rebuild(self.runtime, now, fence=fence)
        else:
            stats = rebuild(self.runtime, now, fence=fence, keep_lead=keep_lead)
        self._advance(before, fence)
        # Said once the generation is set again: the index is whole, its fast paths lease.
        logger.info("index.rebuilt", extra={"event": "index.rebuilt", **asdict(stats)})
        # The pass indexed every row it read; the walk resumes where a row could have
        # changed after its read.
        self._queued_cursor, self._sweep_started = (now - QUEUED_GRACE_S, ""), now
        return stats

    # -- 1. the epoch --------------------------------------------------------------------

    def _epoch_is_stale(self) -> bool:
        """True when the index's epoch is not SQL's; else advance both by one."""
        with self.runtime.sessions.begin() as session:
            epoch = upkeep_sql.index_epoch(session, self.runtime.pool)
        found = self.runtime.index.generation()
        if epoch is None or found != str(epoch):
            # None in SQL: the first round ever. None in Redis: it lost its data. Another
            # value: it came back from an older snapshot (or a replica that lagged).
            event = ("index.epoch_new" if epoch is None else
                     "index.lost" if found is None else "index.from_old_snapshot")
            logger.warning(event, extra={"event": event, "sql_epoch": epoch,
                                         "index_epoch": found})
            return True
        self._advance(epoch, None)
        return False

    def _advance(self, epoch: int | None, fence: str | None) -> None:
        new = (epoch or 0) + 1
        with self.runtime.sessions.begin() as session:
            moved = upkeep_sql.advance_epoch(session, expected=epoch, epoch=new,
                                             pool=self.runtime.pool)
        if moved:
            self.runtime.index.set_generation(str(new), fence=fence)
            self.written = str(new)

    # -- 2. in flight without a lease ----------------------------------------------------

    def _in_flight(self, now: float, fence: str | None, stats: ReconcileStats) -> None:
        with self.runtime.sessions() as session:
            jobs = jobs_sql.jobs_after(
                session, IN_FLIGHT, after=self._flight_cursor, limit=IN_FLIGHT_BATCH,
                scope=self.runtime.scope,
            )
        self._flight_cursor = jobs[-1].id if len(jobs) == IN_FLIGHT_BATCH else ""
        held = self.runtime.index.entries_of([job.id for job in jobs])
        settling = now - self.runtime.policy.lease_ttl_s / 2
        orphans = [job for job in jobs if not _holds_lease(held.get(job.id), job)
                   and not _just_started(job, settling)]
        for job in jobs:
            if job.cancel_requested and job.status is Status.RUNNING and job not in orphans:
                # The API flags the lease after its commit; an interruption in between
                # leaves the request in SQL only. Flagging twice changes nothing.
                self.runtime.index.flag_cancel(job.id, attempt=job.attempt)
        if not orphans:
            return
        entries: list[IndexedJob] = []
        with self.runtime.sessions.begin() as session:
            check_lead(session, fence)  # a successor's own round decides, not this one
            for job in orphans:
                outcome = recover(session, job, now)
                if outcome.entry is not None:
                    entries.append(outcome.entry)
                if outcome.requeued or outcome.failed or outcome.expired:
                    stats.orphans_recovered += 1
                    logger.warning("job.orphan_recovered", extra={
                        "event": "job.orphan_recovered", "job_id": job.id,
                        "status": job.status.value, "attempt": job.attempt,
                    })
        self.runtime.index.requeue_many(entries, fence=fence)

    # -- 3. queued but not indexed -------------------------------------------------------

    def _queued(self, now: float, fence: str | None, stats: ReconcileStats) -> None:
        with self.runtime.sessions() as session:
            jobs = jobs_sql.settled_queued(
                session, after=self._queued_cursor, until=now - QUEUED_GRACE_S,
                limit=QUEUED_BATCH, scope=self.runtime.scope,
            )
        if jobs:
            last = jobs[-1]
            self._queued_cursor = (last.updated_at or 0.0, last.id)
        if len(jobs) < QUEUED_BATCH and now - self._sweep_started >= FULL_SWEEP_S:
            self._queued_cursor, self._sweep_started = None, now  # start over from the oldest
        held = self.runtime.index.entries_of([job.id for job in jobs])
        unheld = [job.id for job in jobs if not _holds_entry(held.get(job.id), job.attempt)]
        if not unheld:
            return
        with self.runtime.sessions() as session:  # the rows to index, read whole, still queued
            rows = jobs_sql.get_jobs(session, unheld)
        missing = [job for job in rows.values() if job.status is Status.QUEUED]
        stats.reindexed += self.runtime.index.requeue_many(
            (indexed(job) for job in missing), fence=fence
        )
        for job in missing:
            logger.warning("job.reindexed", extra={
                "event": "job.reindexed", "job_id": job.id, "attempt": job.attempt})

    # -- 4. entries without a live row ---------------------------------------------------

    def _entries(self, now: float, fence: str | None, stats: ReconcileStats) -> None:
        self._entry_cursor, entries = self.runtime.index.scan_entries(
            self._entry_cursor, ENTRY_BATCH
        )
        if not entries:
            return
        with self.runtime.sessions() as session:
            states = jobs_sql.states_of(session, (entry.job_id for entry in entries))
        index, stale = self.runtime.index, []
        for entry in entries:
            status, attempt, tenant = states.get(entry.job_id, (None, 0, None))
            if status is Status.QUEUED and entry.attempt < attempt:
                stale.append(entry.job_id)  # an earlier attempt's entry: the row's replaces it
            elif (status is None and not may_be_uncommitted(entry.job_id, now)) or (
                status is not None and status.terminal
            ):
                if entry.leased:
                    index.release(entry.job_id, attempt=entry.attempt, fence=fence)
                else:
                    index.cancel(entry.job_id, tenant=tenant, fence=fence)
                stats.removed += 1
        if stale:  # rare: only these rows are read whole
            with self.runtime.sessions() as session:
                rows = jobs_sql.get_jobs(session, stale)
            stats.reindexed += index.requeue_many(
                (indexed(job) for job in rows.values() if job.status is Status.QUEUED),
                fence=fence)


def _holds_lease(entry: Entry | None, job: Job) -> bool:
    """The in-flight attempt holds its lease (or the index already has a later entry)."""
    if entry is None:
        return False
    return entry.attempt > job.attempt or (entry.attempt == job.attempt and entry.leased)


def _just_started(job: Job, since: float) -> bool:
    """A running row started after ``since`` (half a lease TTL ago) may be one whose start
    landed after its lease was reaped: its worker's next renewal finds no lease and hands
    it back uncharged within moments. Deciding it now would charge a start nobody ran; it
    is decided on a later round if it is still there."""
    return job.status is Status.RUNNING and job.started_at is not None and job.started_at > since


def _holds_entry(entry: Entry | None, attempt: int) -> bool:
    """The index holds this queued attempt (queued, delayed or already leased) or a later one."""
    return entry is not None and entry.attempt >= attempt

