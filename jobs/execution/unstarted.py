"""A start that moved nothing, settled: the worker meets what the dispatch leased.

A mixin of ``jobs.execution.attempt._Attempt`` (as ``jobs.execution.outcome`` is), apart
because none of it runs on the usual path: a dispatch writes nothing to SQL, so when the
start's compare-and-set finds no startable row, the row read back decides. No row yet: its
INSERT may not have committed; the slot waits a moment for it, then puts the job back
(``settle_uncommitted``). This handling's own start made ahead,
landed late: run it. Ended or moved on: free the lease when it is this attempt's, and do
nothing else. Cancelled or past ``start_by``: end it unrun. Startable after all (its commit
landed between the two statements): start it again.

A start that moved, of a job whose kind this worker has no handler for (a rolling deploy, a
host without a package: ``jobs.execution.running.NOT_HERE``), is settled here too: nothing
ran, so the job goes back to the queue uncharged, in its place, and the pool is told first
that it is routed by kind from now on (``jobs.index.worker_registry``): the job's next
attempt reaches only a worker that runs its kind, or waits, parked, until one registers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from jobs.core.cadence import UNCOMMITTED_WAIT_S
from jobs.core.domain import Job
from jobs.core.ids import may_be_uncommitted
from jobs.core.states import Status
from jobs.execution.leases import retry_sql
from jobs.execution.outcome import STALE
from jobs.execution.slots import Passed, free_lease, put_back_soon, settle_uncommitted
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql

logger = logging.getLogger("tierq.worker")

# What a start moves from (``jobs_sql.start``).
STARTABLE = (Status.QUEUED, Status.DISPATCHED)


class SettlesUnstarted:
    """The settlements of a start that moved nothing; the attempt provides the rest."""

    runtime: Runtime
    job_id: str
    attempt: int
    worker_id: str
    token: str
    job: Job | None
    clock: Callable[[], float]
    _owns_token: bool
    _holds_lease: Callable[[], bool]

    def _start(self) -> Job | None:
        raise NotImplementedError

    def _transition(
        self, src: Status, dst: Status, *, announce: bool = True, unsure: bool = False,
        **fields: Any,
    ) -> bool:
        raise NotImplementedError

    def _pass_slot(self) -> Passed | None:
        raise NotImplementedError

    def _release(self, outcome: Status | None, passed: Passed | None = None) -> None:
        raise NotImplementedError

    def _log(self, level: int, event: str, *, exc_info: bool = False, **fields: Any) -> None:
        raise NotImplementedError

    def _hand_back(self, src: Status, reason: str = "") -> str:
        raise NotImplementedError

    def _not_run_here(self) -> str:
        """No handler here for the job's kind: the pool routed by kind (its kind noted as
        waiting for a worker that runs it), then the job handed back, uncharged. The note
        goes first, so the dispatcher the hand-back rings already sends the job by its kind
        (a note lost to Redis costs a trip back here, uncharged again, no more)."""
        assert self.job is not None, "settled after its start, which read the row"
        kind = self.job.kind
        try:
            self.runtime.index.note_kinds_waiting([kind])
        except redis.RedisError:
            self._log(logging.ERROR, "job.route_failed", exc_info=True)
        return self._hand_back(Status.RUNNING, reason=f"no handler for kind {kind!r} here")

    def _read(self) -> Job | None:
        def read() -> Job | None:
            with self.runtime.sessions() as session:
                return jobs_sql.get_job(session, self.job_id)

        return retry_sql(read, keep_trying=self._holds_lease, what="read", job_id=self.job_id)

    def _not_started(self) -> str | Job:
        """The start did not happen: a row not committed yet, a copy of a message, a job
        moved on, or one that must not compute (cancel requested, ``start_by`` passed), which
        ends without running. What the dispatch leased for this attempt is settled here: a
        dispatch writes nothing to SQL, so the start is where a lease meets its row. A row
        that may start after all (its commit landed between the start's statement and this
        read) is started again: the row it returns, or the outcome."""
        job = self._read() or self._await_commit()
        if job is None:
            return self._not_committed()
        if self._owns_token and job.attempt == self.attempt and job.status is Status.RUNNING:
            own = self._started_by_me()
            if own is not None:
                return own  # the start made ahead for this message, landed late
        if job.attempt == self.attempt and job.status is Status.WAITING:
            job = self._await_fed(job)
            if job.status is Status.WAITING:
                put_back_soon(self.runtime, self.job_id, self.attempt, self.clock())
                return self._stale(job)
        if job.attempt != self.attempt or job.status not in STARTABLE:
            if job.attempt == self.attempt and job.status is not Status.RUNNING:
                # ended: nobody runs this attempt
                free_lease(self.runtime, self.job_id, self.attempt)
            return self._stale(job)
        self.job = job
        ended = self._before_start(job)
        if ended is not None:
            return ended
        started = self._start()
        return self._stale(job) if started is None else started

    def _started_by_me(self) -> Job | None:
        def read() -> Job | None:
            with self.runtime.sessions() as session:
                return jobs_sql.started_by(session, self.job_id, attempt=self.attempt,
                                           token=self.token)

        return retry_sql(read, keep_trying=self._holds_lease, what="read", job_id=self.job_id)

    def _await_commit(self) -> Job | None:
        """The row of a submit whose commit is on its way, read again for at most
        ``UNCOMMITTED_WAIT_S``: the slot holding its lease waits the millisecond or two for
        it, rather than put it back for a dispatcher to offer again (none may be running)."""
        if not may_be_uncommitted(self.job_id, self.clock()):
            return None
        deadline = time.monotonic() + UNCOMMITTED_WAIT_S
        pause = 0.002
        while time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
            job = self._read()
            if job is not None:
                return job
        return None

    def _await_fed(self, job: Job) -> Job:
        """A batch item the feeder indexed before its UPDATE to queued committed (the
        feeder admits first): read again for at most ``UNCOMMITTED_WAIT_S`` while it is
        still waiting, rather than drop a lease the feed is about to make good."""
        deadline = time.monotonic() + UNCOMMITTED_WAIT_S
        pause = 0.002
        while job.status is Status.WAITING and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
            job = self._read() or job
        return job

    def _not_committed(self) -> str:
        settle_uncommitted(self.runtime, self.job_id, self.attempt, self.clock())
        return self._stale(None)

    def _stale(self, job: Job | None) -> str:
        logger.info(
            "job.stale",
            extra={
                "event": "job.stale", "job_id": self.job_id, "attempt": self.attempt,
                "worker_id": self.worker_id, "status": None if job is None else job.status.value,
                "current_attempt": None if job is None else job.attempt,
            },
        )
        return STALE

    def _before_start(self, job: Job) -> str | None:
        """Cancelled or expired before it started: end it without computing anything."""
        if job.cancel_requested:
            dst = Status.CANCELLED
        elif job.start_by is not None and self.clock() >= job.start_by:
            dst = Status.EXPIRED
        else:
            return None
        if not self._transition(job.status, dst, announce=False):  # the release does
            self._log(logging.INFO, "job.stale", reason="not dispatched any more")
            return STALE
        self._release(dst, self._pass_slot())
        self._log(logging.INFO, f"job.{dst.value}", before_start=True)
        return dst.value
