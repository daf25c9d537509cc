"""A slot passing from the attempt that frees it to its next job, in the same step.

A mixin of ``jobs.execution.attempt._Attempt``: before its ending commits, an attempt leases
the best runnable job for its slot and hands that job's message to this worker
(``jobs.execution.slots.pass_slot``); with the thread pool the ending and that job's start
are one statement (``jobs.store.jobs.end_and_start``), and its own lease is released with
that job's first renewal. On PostgreSQL the statement and its COMMIT go out together
(``jobs.store.pipeline.one_trip``), and the next job's task is let run once the statement's
rows are back, before the COMMIT's answer:
its ``Landing`` (``jobs.execution.prestart``) tells when that COMMIT has landed or failed,
and nothing of that job's own moves before (``_await_handing``), nor before its first
renewal: made by the handing task after its COMMIT, or, when the job's handler was done
first, by the job's own hand-over in the same round trip (``FirstRenewal``). docs/states.md,
the hand-over's row, says what an interruption leaves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

from jobs.core.domain import Job
from jobs.core.states import Status
from jobs.execution import limits
from jobs.execution.leases import start_figures, virtual_now
from jobs.execution.prestart import PRE_STARTS, Landing
from jobs.execution.slots import Handover, Passed, pass_slot
from jobs.index import notify
from jobs.index.base import Finished, FirstRenewal
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store.pipeline import one_trip


class HandsOver:
    """The hand-over's steps; the attempt provides the state."""

    runtime: Runtime
    handover: Handover | None
    job_id: str
    attempt: int
    clock: Callable[[], float]
    _virtual_clock: Callable[[], float] | None
    # Handed this job by a slot (its message carried a token): the queue had work then.
    _from_hand_over: bool
    # This job, started and run before its handing statement's COMMIT: no move of its own
    # before that COMMIT has landed and its first renewal is made (or is this attempt's own).
    _landed: Landing | None
    # Claimed from ``_landed``: the first renewal this attempt makes itself, in its
    # hand-over's round trip or before its next move.
    _owed: Landing | None = None
    # Set by ``_end_and_start`` when it let the next job run before its COMMIT; landed and
    # closed by this attempt (``_release_or_pass``, ``_handed_on``).
    next_landed: Landing | None

    @property
    def _job(self) -> Job:
        raise NotImplementedError

    def _log(self, level: int, event: str, *, exc_info: bool = False, **fields: Any) -> None:
        raise NotImplementedError

    def _announce_batch(self) -> None:
        raise NotImplementedError

    def _await_handing(self, *, fold: bool = False) -> None:
        """Run before the handing statement's COMMIT: wait until it has landed (or failed)
        and this attempt's first renewal is made, before any move of this attempt's own. A
        statement of ours sent earlier would not see the row started (its snapshot comes
        before that COMMIT) and would record the ending as stale; a slot passed on earlier
        would find the handing lease still counted against its tenant. ``fold``: this
        attempt's ending passes its slot on next; when the handing task has not made the
        renewal yet, the ending makes it itself (``_owed``), in the hand-over's round trip."""
        landing, wait_s = self._landed, self.runtime.policy.lease_ttl_s
        if landing is None:
            return
        if fold and landing.claim():
            if landing.committed.wait(wait_s) or not landing.unclaim():
                self._owed = landing
                return
        elif landing.renewed.wait(wait_s):
            return
        self._log(logging.WARNING, "job.handing_commit_late")

    def _take_owed(self) -> Landing | None:
        """The first renewal this attempt owes (``_await_handing``), taken to be made now;
        None when none is owed (a start whose COMMIT failed owes none: said so at once)."""
        landing, self._owed = self._owed, None
        if landing is not None and not landing.landed_ok:
            landing.renewal_made()
            return None
        return landing

    def _pay_owed(self) -> None:
        """The owed first renewal, made on its own (no hand-over took it), before any other
        move of this attempt's."""
        owed = self._take_owed()
        if owed is not None:
            try:
                self._first_renewal_of(self._job, release=owed.release)
            finally:
                owed.renewal_made()

    def _pass_slot(self) -> Passed | None:
        """With a ``handover``, before the ending's commit: the job this slot takes next,
        leased and sent (``jobs.execution.slots.pass_slot``), this attempt's lease kept. None in
        a process being ended for an overrun: the job would wait for it in vain."""
        if self.handover is None or limits.ending():
            return None
        owed = self._take_owed()
        first = None if owed is None else FirstRenewal(
            ttl_s=self.runtime.policy.lease_ttl_s, start=start_figures(self._job),
            release=owed.release)
        try:
            return pass_slot(self.runtime, self.handover, job_id=self.job_id,
                             attempt=self.attempt, now=virtual_now(self._virtual_clock),
                             first=first)
        finally:
            if owed is not None:  # made (best effort): its batch's counts moved too
                try:
                    self._announce_batch()
                finally:
                    owed.renewal_made()

    def _end_and_start(
        self, dst: Status, fields: dict[str, Any], passed: Passed
    ) -> tuple[bool, Job | None]:
        """This attempt's ending and the next job's start (made ahead for its message,
        under its token), one statement (``jobs.store.jobs.end_and_start``); one try."""
        lease = passed.lease
        direct = self.runtime.direct
        with (self.runtime.one_statement() if direct is None
              else one_trip(direct)) as connection:
            moved, started = jobs_sql.end_and_start(
                connection, self.job_id, attempt=self.attempt, dst=dst, now=self.clock(),
                fields=fields, next_id=lease.job_id, next_attempt=lease.attempt,
                token=passed.token,
                dispatched_at=lease.expires_at - self.runtime.policy.lease_ttl_s)
            if started is not None and direct is not None:
                # Both rows are this transaction's until its COMMIT: no other start can take
                # the next job meanwhile, so it runs now, while the ending's COMMIT waits for
                # the disk (a COMMIT that fails leaves it a lost start: docs/states.md).
                landed = Landing()
                if PRE_STARTS.settle(passed.token, started, landed=landed):
                    self.next_landed = landed
        return moved, started

    def _release_or_pass(
        self, moved: bool, dst: Status, started: Job | None, passed: Passed | None
    ) -> None:
        """After the ending's commit: this attempt's lease released, by the next job's first
        renewal when its start was made here too (one round trip for both, announcing and
        counting this ending), else here."""
        if started is not None and passed is not None:
            ending = Finished(job_id=self._job.id, attempt=self._job.attempt,
                              outcome=dst.value,
                              capacity=self.runtime.policy.pool_concurrency)
            landing = self.next_landed
            if landing is not None:  # its task runs already: renew for it, unless it does
                if landing.land(ending if moved else None):
                    self._first_renewal_of(started, release=ending if moved else None)
                    landing.renewal_made()
            else:
                PRE_STARTS.settle(passed.token, started, release=ending if moved else None)
            if not moved:
                self._release(None, passed)
            return
        if passed is not None and self.handover is not None and self.handover.prestart:
            PRE_STARTS.settle(passed.token, None)  # its task makes the start itself
        if passed is not None or moved:
            self._release(dst if moved else None, passed)

    def _handed_on(self) -> None:
        """Last of an ending, whatever became of it: the next job's task, let run before the
        COMMIT, may move its row now."""
        landed, self.next_landed = self.next_landed, None
        if landed is not None:
            landed.close()

    def _first_renewal_of(self, job: Job, *, release: Finished | None) -> None:
        """The first renewal of the next job's lease, made for its task, which runs already
        (settled before this COMMIT): now that the COMMIT has landed, it announces that
        start, records its figures and releases this attempt's lease (``release``), in one
        round trip, as the task's own first renewal would. Best effort: a lease left
        unreleased lapses and is reaped, and the next job's own renewals keep its lease."""
        try:
            self.runtime.index.renew_checked(
                job.id, attempt=job.attempt, ttl_s=self.runtime.policy.lease_ttl_s,
                now=virtual_now(self._virtual_clock), announce=True, start=start_figures(job),
                release=release)
            if job.batch_id is not None:
                notify.announce_batches(self.runtime.redis, self.runtime.prefix, [job.batch_id])
        except redis.RedisError:
            self._log(logging.WARNING, "job.release_failed", exc_info=True)

    def _release(self, outcome: Status | None, passed: Passed | None = None) -> None:
        """After an ending's commit: release, announce the change and count the outcome
        (None: a stale ending, nothing to announce), one round trip. The dispatcher's
        doorbell rings without a ``handover``; with one, a slot that tried to pass itself
        on and took nothing rings only when a job is runnable all the same (the pool was
        full of leases kept until their next job's first renewal: the dispatcher fills the
        slot); batch items are fed on the feeder's own cadence. Best effort: a lease that
        cannot be released now expires and is reaped (a lost announcement costs a long-poll
        its safety-net period, a lost count one job in ``tierq_jobs_entered_total``)."""
        try:
            self.runtime.index.release(
                self.job_id, attempt=self.attempt, ring=self.handover is None,
                ring_if_runnable=passed is None,
                announce=outcome is not None, outcome=None if outcome is None else outcome.value)
        except redis.RedisError:
            self._log(logging.WARNING, "job.release_failed", exc_info=True)
