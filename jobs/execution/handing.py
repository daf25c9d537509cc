"""A slot passing from the attempt that frees it to its next job, in the same step.

A mixin of ``jobs.execution.attempt._Attempt``: before its ending commits, an attempt leases
the best runnable job for its slot and hands that job's message to this worker
(``jobs.execution.slots.pass_slot``); with the thread pool the ending and that job's start
are one statement (``jobs.store.jobs.end_and_start``), and its own lease is released with
that job's first renewal. On PostgreSQL the statement's BEGIN is sent before the hand-over's
script (``DirectPool.begin_ahead``), and the next job's task is let run before the COMMIT:
its ``landed`` event (``jobs.execution.prestart``) is set once that COMMIT has landed or
failed and its first renewal is made, and nothing of that job's own moves before
(``_await_handing``). docs/states.md, the hand-over's row, says what an interruption leaves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from jobs.core.domain import Job
from jobs.core.states import Status
from jobs.execution import limits
from jobs.execution.leases import start_figures, virtual_now
from jobs.execution.prestart import PRE_STARTS
from jobs.execution.slots import Handover, Passed, pass_slot
from jobs.index import notify
from jobs.index.base import Finished
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store.direct import Ahead


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
    # This job, started and run before its handing statement's COMMIT: set once that COMMIT
    # has landed and this attempt's first renewal is made; no move of its own before.
    _landed: threading.Event | None
    # Set by ``_end_and_start`` when it let the next job run before its COMMIT; set (the
    # event) by ``_handed_on`` once that COMMIT has landed or failed.
    next_landed: threading.Event | None
    # The ending's transaction, begun ahead; discarded when no statement took it.
    ahead: Ahead | None

    @property
    def _job(self) -> Job:
        raise NotImplementedError

    def _log(self, level: int, event: str, *, exc_info: bool = False, **fields: Any) -> None:
        raise NotImplementedError

    def _await_handing(self) -> None:
        """Run before the handing statement's COMMIT: wait until it has landed (or failed)
        and this attempt's first renewal is made, before any move of this attempt's own. A
        statement of ours sent earlier would not see the row started (its snapshot comes
        before that COMMIT) and would record the ending as stale; a slot passed on earlier
        would find the handing lease still counted against its tenant."""
        landed = self._landed
        if landed is not None and not landed.wait(self.runtime.policy.lease_ttl_s):
            self._log(logging.WARNING, "job.handing_commit_late")

    def _begin_ahead(self) -> None:
        """On PostgreSQL, with the next job's start made in the ending's statement: that
        transaction's BEGIN goes out before the slot passes on, so its round trip runs beside
        the hand-over's instead of after it (``DirectPool.begin_ahead``). Only for a job
        that was itself handed over: the queue had work a moment ago, so its slot most likely
        takes a next job too (on an idle queue a BEGIN would be sent for nothing)."""
        direct, handover = self.runtime.direct, self.handover
        if direct is not None and handover is not None and handover.prestart \
                and self._from_hand_over and not limits.ending():
            self.ahead = direct.begin_ahead()

    def _pass_slot(self) -> Passed | None:
        """With a ``handover``, before the ending's commit: the job this slot takes next,
        leased and sent (``jobs.execution.slots.pass_slot``), this attempt's lease kept. None in
        a process being ended for an overrun: the job would wait for it in vain."""
        if self.handover is None or limits.ending():
            return None
        return pass_slot(self.runtime, self.handover, job_id=self.job_id,
                         attempt=self.attempt, now=virtual_now(self._virtual_clock))

    def _end_and_start(
        self, dst: Status, fields: dict[str, Any], passed: Passed
    ) -> tuple[bool, Job | None]:
        """This attempt's ending and the next job's start (made ahead for its message,
        under its token), one statement (``jobs.store.jobs.end_and_start``); one try."""
        lease = passed.lease
        direct, ahead, self.ahead = self.runtime.direct, self.ahead, None
        with (self.runtime.one_statement() if direct is None
              else direct.transaction(ahead=ahead)) as connection:
            moved, started = jobs_sql.end_and_start(
                connection, self.job_id, attempt=self.attempt, dst=dst, now=self.clock(),
                fields=fields, next_id=lease.job_id, next_attempt=lease.attempt,
                token=passed.token,
                dispatched_at=lease.expires_at - self.runtime.policy.lease_ttl_s)
            if started is not None and direct is not None:
                # Both rows are this transaction's until its COMMIT: no other start can take
                # the next job meanwhile, so it runs now, while the ending's COMMIT waits for
                # the disk (a COMMIT that fails leaves it a lost start: docs/states.md).
                landed = threading.Event()
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
            if self.next_landed is not None:  # its task runs already: renew for it
                self._first_renewal_of(started, release=ending if moved else None)
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
        COMMIT, may move its row now; a transaction begun for a next job there was none of
        is rolled back."""
        landed, self.next_landed = self.next_landed, None
        if landed is not None:
            landed.set()
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            ahead.discard()

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
