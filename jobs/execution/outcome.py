"""How a started attempt ends: its handler's ``Ending`` recorded as the job's outcome.

A mixin of ``jobs.execution.attempt._Attempt``, which owns the attempt's state (the row, the
compare-and-set, the release): what is decided here is only which move an ending makes. A
success stores its result (inline or as a blob); a retryable error goes back to the queue as
the next attempt after its backoff, unless its starts are spent or the retry could only
start after the job's deadline (then ``failed``, saying why); an attempt past its run-time
limit is retried the same way when its kind says so (``retry_on_timeout``), else ``failed``;
an outcome the database refuses (a U+0000 PostgreSQL cannot hold) ends the attempt once,
``failed`` with the reason. Every ``failed`` names its ``error_type``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import redis
import sqlalchemy.exc as sa_exc

from jobs.core.domain import Job
from jobs.core.error_types import ErrorType
from jobs.core.packing import split_cap
from jobs.core.policy import retry_backoff_s
from jobs.core.states import Status
from jobs.execution.handlers import JobContext
from jobs.execution.leases import Heartbeat, LeaseKeeper, is_sql_outage, retry_sql
from jobs.execution.limits import timed_out_error
from jobs.execution.packing import SPLIT
from jobs.execution.results import result_fields
from jobs.execution.running import (
    FAILED,
    NOT_HERE,
    SUCCEEDED,
    TIMED_OUT,
    Ending,
    cut_error,
    describe_error,
)
from jobs.execution.slots import Handover, Passed, entry_of, ring
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql

REQUEUED, STALE = "requeued", "stale"


class RecordsOutcome:
    """The endings of an attempt; the attempt provides the state and the moves."""

    runtime: Runtime
    worker_id: str
    clock: Callable[[], float]
    # The attempt's run-time limit, and whether its kind retries an attempt past it.
    limit_s: float
    retries_timeout: bool
    # How many items the run this attempt led held (1: it ran alone).
    run_items: int
    # The handler's context (its last progress report is stored with the ending).
    ctx: JobContext | None
    # This handling's start token, when its lease was taken, and whether it still holds it.
    token: str
    dispatched_at: float | None
    _holds_lease: Callable[[], bool]
    _keeper: LeaseKeeper

    @property
    def _job(self) -> Job:
        raise NotImplementedError

    handover: Handover | None

    def _transition(
        self, src: Status, dst: Status, *, announce: bool = True, unsure: bool = False,
        **fields: Any,
    ) -> bool:
        raise NotImplementedError

    def _announce_batch(self) -> None:
        raise NotImplementedError

    def _hand_back(self, src: Status, reason: str = "", **extra: Any) -> str:
        raise NotImplementedError

    def _split(self, run_cap: int) -> str:
        """The run this attempt led failed as a whole: back to the queue uncharged, in runs
        of at most ``run_cap`` items from now on (``jobs.core.packing``)."""
        return self._hand_back(Status.RUNNING, reason=f"its run of {self.run_items} failed "
                               f"as a whole: split into runs of {run_cap}", run_cap=run_cap)

    def _not_run_here(self) -> str:
        raise NotImplementedError

    def _pass_slot(self) -> Passed | None:
        raise NotImplementedError

    def _pay_owed(self) -> None:
        raise NotImplementedError

    def _release_or_pass(
        self, moved: bool, dst: Status, started: Job | None, passed: Passed | None
    ) -> None:
        raise NotImplementedError

    def _handed_on(self) -> None:
        raise NotImplementedError

    def _end_and_start(
        self, dst: Status, fields: dict[str, Any], passed: Passed
    ) -> tuple[bool, Job | None]:
        raise NotImplementedError

    def _log(self, level: int, event: str, *, exc_info: bool = False, **fields: Any) -> None:
        raise NotImplementedError

    def _finish(self, ending: Ending, heartbeat: Heartbeat) -> str:
        """Record how the handler ended (a lease lost meanwhile: the reaper has the job)."""
        if ending.kind == "lease_lost":
            self._log(logging.WARNING, "job.stale", reason="lease lost")
            return STALE
        if ending.kind in ("handback", NOT_HERE):
            heartbeat.stop()  # the requeue replaces this attempt's lease; no renewal after it
            if ending.kind == NOT_HERE:
                return self._not_run_here()
            return self._hand_back(Status.RUNNING, reason="worker stopping")
        if ending.kind == SPLIT:
            heartbeat.stop()
            return self._split(int(ending.result))
        if ending.kind == "retry":
            return self._retry(ending.error or "RetryableError", heartbeat)
        if ending.kind == TIMED_OUT:
            return self._timed_out(heartbeat)
        if ending.kind == SUCCEEDED:
            try:
                encoded = json.dumps(ending.result, allow_nan=False, separators=(",", ":"))
            except (TypeError, ValueError) as exc:
                error = f"result is not JSON-serialisable: {describe_error(exc)}"
                return self._end(Status.FAILED, heartbeat, error=cut_error(error),
                                 error_type=ErrorType.RESULT_UNSTORABLE.value)
            return self._end(Status.SUCCEEDED, heartbeat, **result_fields(
                self.runtime, encoded, clock=self.clock, job=self._job, worker_id=self.worker_id))
        if ending.kind == FAILED:
            return self._end(Status.FAILED, heartbeat, error=ending.error,
                             error_type=ErrorType.HANDLER_ERROR.value)
        return self._end(Status.CANCELLED, heartbeat)

    def _end(self, dst: Status, heartbeat: Heartbeat, **fields: Any) -> str:
        """An ending: the slot passed on first (the next job leased and sent, this attempt's
        lease kept), then the ending committed (with the thread pool, in the statement that
        starts that next job), then this attempt's lease released."""
        heartbeat.first_renewed()  # the slot this job was handed is no longer counted twice
        report = None if self.ctx is None else self.ctx.last_report
        if report is not None:  # the last report outlives its Redis copy, with the ending
            fields = {**fields, "progress": report.to_dict()}
        passed = self._pass_slot()
        self._pay_owed()  # not made in the hand-over's round trip: made now, before the rest
        try:
            moved, dst, fields, started = self._record_end(dst, fields, passed)
            heartbeat.stop()  # no renewal may follow the release
            self._release_or_pass(moved, dst, started, passed)
        finally:
            self._handed_on()
        if not moved:
            self._log(logging.WARNING, "job.stale", reason="late result rejected")
            return STALE
        self._announce_batch()
        level = logging.WARNING if dst is Status.FAILED else logging.INFO
        self._log(level, f"job.{dst.value}", error=fields.get("error"),
                  duration_s=self._run_time())
        return dst.value

    def _record_end(
        self, dst: Status, fields: dict[str, Any], passed: Passed | None
    ) -> tuple[bool, Status, dict[str, Any], Job | None]:
        """Commit the ending: whether it moved, the move and fields it made, and the next
        job's row when its start was made here too. With the next job's start made ahead
        (``prestart``), both in one statement, once: one that fails leaves the start to the
        next job's own task (which finds it, by its token, if the statement landed after
        all) and the ending to ``_end_alone``."""
        ahead = passed is not None and self.handover is not None and self.handover.prestart
        if not ahead or passed is None:
            return (*self._end_alone(dst, fields), None)
        try:
            moved, started = self._end_and_start(dst, fields, passed)
        except sa_exc.DataError:
            return (*self._end_alone(dst, fields), None)  # nothing of it was stored
        except Exception as exc:
            if not is_sql_outage(exc):
                raise
            return (*self._end_alone(dst, fields, unsure=True), None)
        if not moved:  # this attempt's own start may have been lost: made again with it
            return (*self._end_alone(dst, fields), started)
        return moved, dst, fields, started

    def _end_alone(
        self, dst: Status, fields: dict[str, Any], *, unsure: bool = False
    ) -> tuple[bool, Status, dict[str, Any]]:
        """The ending's compare-and-set (``unsure``: it may have landed already). An outcome
        the database refuses (a U+0000 in a result PostgreSQL cannot hold) ends the attempt
        once, failed with what can be stored, never run again."""
        try:
            moved = self._transition(Status.RUNNING, dst, announce=False, unsure=unsure,
                                     **fields) or self._end_lost_start(dst, fields)
        except sa_exc.DataError as exc:
            if dst is Status.FAILED and set(fields) <= {"error", "error_type"}:
                raise  # not even a plain error text could be stored
            first = str(exc.orig or exc).splitlines()[0]
            self._log(logging.WARNING, "job.outcome_unstorable", error=first, outcome=dst.value)
            return self._end_alone(Status.FAILED, {
                "error": cut_error(f"the job's {dst.value} outcome could not be stored: {first}"),
                "error_type": ErrorType.RESULT_UNSTORABLE.value})
        return moved, dst, fields

    def _end_lost_start(self, dst: Status, fields: dict[str, Any]) -> bool:
        """The ending found its row not running. A start lost with its COMMIT (one made
        ahead, whose handler was let run before that COMMIT failed, or one not durable, lost
        in a crash of the database) leaves the row queued at this attempt, and while this
        attempt holds its lease no other start can take it: the start is made again as it
        was, under this handling's token, with the ending in the same transaction. The
        result in hand is recorded once, not thrown away for the job to run again. A row
        moved by anything else stays as it is (the ending is stale), as does one whose lease
        Redis no longer holds for this attempt: asked first, since the heartbeat learns of a
        lost lease only at its next renewal."""
        if not (self._holds_lease() and self._keeper.renew()):
            return False
        job, retried = self._job, [False]

        def again() -> bool:
            with self.runtime.sessions.begin() as session:
                if retried[0] and jobs_sql.landed(session, job, Status.RUNNING, dst):
                    return True  # made, its COMMIT's answer lost
                return jobs_sql.end_lost_start(
                    session, job, dst=dst, now=self.clock(), fields=fields, token=self.token,
                    dispatched_at=self.dispatched_at)

        def keep_trying() -> bool:
            retried[0] = True
            return self._holds_lease()

        moved = retry_sql(again, keep_trying=keep_trying, what="lost start",
                          job_id=job.id)
        if moved:
            self._log(logging.WARNING, "job.start_made_again", outcome=dst.value)
        return moved

    def _timed_out(self, heartbeat: Heartbeat) -> str:
        """The attempt ran past its limit: retried when its kind says so, else failed. A run
        of several items past its limit failed as a whole: split, uncharged."""
        if self.run_items > 1:
            heartbeat.stop()
            return self._split(split_cap(self.run_items))
        error = timed_out_error(self.limit_s)
        if self.retries_timeout:
            return self._retry(error, heartbeat, spent=ErrorType.TIMED_OUT)
        return self._end(Status.FAILED, heartbeat, error=cut_error(error),
                         error_type=ErrorType.TIMED_OUT.value)

    def _retry(self, error: str, heartbeat: Heartbeat,
               spent: ErrorType = ErrorType.STARTS_EXHAUSTED) -> str:
        """Back to the queue after its backoff; ``failed`` when no start remains (with
        ``spent`` as its error type) or the retry could not start before the deadline."""
        job, policy = self._job, self.runtime.policy
        starts = job.starts  # the row as started: this attempt's start included
        if starts >= job.max_attempts:
            return self._end(
                Status.FAILED, heartbeat,
                error=cut_error(f"{error} (start {starts} of {job.max_attempts})"),
                error_type=spent.value,
            )
        delay = retry_backoff_s(starts, policy.retry_backoff_s, policy.retry_backoff_max_s)
        not_before = self.clock() + delay
        if job.start_by is not None and not_before >= job.start_by:
            return self._end(
                Status.FAILED, heartbeat,
                error=cut_error(f"{error} (start {starts}; a retry could not start before the "
                           "job's deadline, max_wait_s)"),
                error_type=ErrorType.DEADLINE.value,
            )
        if not self._transition(Status.RUNNING, Status.QUEUED, not_before=not_before):
            self._log(logging.WARNING, "job.stale", reason="late retry rejected")
            return STALE
        heartbeat.stop()
        try:
            # Replaces this attempt's lease atomically (the entry is the next attempt's): no
            # release afterwards, which could drop the lease of the next attempt.
            self.runtime.index.requeue(
                entry_of(job, attempt=job.attempt + 1, not_before=not_before)
            )
        except redis.RedisError:
            self._log(logging.ERROR, "job.requeue_failed", exc_info=True)
        ring(self.runtime)
        self._log(logging.INFO, "job.requeued", not_before=not_before, error=error)
        return REQUEUED

    def _run_time(self) -> float | None:
        """Seconds since this attempt started (the ``duration_s`` of its ending)."""
        started = self._job.started_at
        return None if started is None else round(max(0.0, self.clock() - started), 6)
