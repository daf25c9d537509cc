"""The worker side of a job: start it, keep its lease, run its handler, record how it ended.

Celery-free: the ``tierq.run_job`` task only unpacks its message's arguments and calls
``execute``. Every state change is a compare-and-set on ``(status, attempt)``, so a
duplicated or stale message, or a late result after the lease was reaped, changes nothing.

- The start is one statement (``jobs_sql.start``: queued → running, returning the row), and
  is also the claim: a dispatch writes nothing to SQL, so what a lease meets (a row not
  committed yet, cancelled, late, ended) is settled after a start that moved nothing
  (``jobs.execution.unstarted``). It names itself in the row with a token new for each
  message handled: a start retried after its COMMIT's answer was lost finds its own start by
  that token, never a copy of the same message's start on another worker. Work nobody will
  collect is not computed: a cancel request or a passed ``start_by`` makes the start not
  happen, and the job ends (``cancelled``/``expired``) without its handler running; only
  then is the row read.
- Right after the start, one round trip renews this attempt's lease and announces the start.
  A lease that is gone (reaped while the message waited in the broker, or lost with Redis)
  means the start is undone: the job goes back to the queue by compare-and-set, uncharged,
  instead of being run by a worker nobody accounts for. A start made ahead by the slot
  that handed the job over (``jobs.execution.prestart``), moments ago under a lease this
  process took, cannot have lost its lease that way: that renewal goes first in the
  heartbeat's thread, beside the handler.
- While the handler runs, a heartbeat thread renews the lease (``jobs.execution.leases``); the
  renewal also tells of a cancel request, so a running job costs SQL nothing. A failed
  renewal marks the lease lost. At its run-time limit the handler is asked to stop; past
  the limit's grace the attempt is recorded timed out from another thread and the process
  ends (``jobs.execution.limits``): whichever of that and the handler's own ending comes
  first is recorded, the other changes nothing. The limit bounds the handler, not the
  recording of its outcome: a handler that returned in time has its ending recorded (a
  large result stored, at most ``result_store_timeout_s``) under a lease still renewed,
  and only a recording past that and the grace ends the process.
- A lease is released only after a state change of *this* attempt succeeded, and release
  names the attempt: a stale call never touches the next attempt's lease. The release also
  passes the slot on (``hand_over``: the best runnable job is leased in the same script and
  its message sent to this worker's own queue) or, with nothing to pass on, rings the
  doorbell; and it announces the change (``jobs.index.notify``), so long-polls of the job
  wake: one round trip. Every other state change is announced after its commit on its own.
- A worker told to stop hands back the jobs it cannot finish within its grace
  (``hand_back_running``: ``jobs.execution.running``): each goes back to the queue as a new
  attempt, uncharged, keeping its place in line, instead of waiting a lease TTL for the reaper.
- ``max_attempts`` counts starts: a retry after the last allowed start, or one that could
  only start after ``start_by``, ends the job ``failed`` (``started_at`` kept), never a
  silent expiry.
- SQL that cannot be reached is waited out, not given up on: every read and compare-and-set
  is retried with backoff while the lease is kept renewed (by hand before the job starts,
  by the heartbeat after), until SQL answers or the lease is lost. A result in hand is never
  thrown away because the database blinked; were the lease lost meanwhile, the CAS on
  ``attempt`` rejects the late write.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import redis

from jobs.core.cadence import UNCOMMITTED_WAIT_S
from jobs.core.domain import Job
from jobs.core.ids import may_be_committing
from jobs.core.states import Status
from jobs.execution import limits
from jobs.execution.handing import HandsOver
from jobs.execution.handlers import JobContext
from jobs.execution.leases import (
    CANCEL_POLL_S,
    Heartbeat,
    LeaseKeeper,
    SqlUnreachable,
    retry_sql,
    start_figures,
)
from jobs.execution.outcome import STALE, RecordsOutcome
from jobs.execution.packing import PackedRun
from jobs.execution.prestart import PRE_STARTS, Claim, Landing
from jobs.execution.progress import ProgressSender
from jobs.execution.registry import HandlerRegistry
from jobs.execution.running import (
    CANCELLED,
    FAILED,
    RUNNING,
    SUCCEEDED,
    Ending,
    call_handler,
    hand_back_running,
    log_job,
)
from jobs.execution.slots import Handover, entry_of, ring
from jobs.execution.unstarted import SettlesUnstarted
from jobs.index import notify
from jobs.index.base import Finished
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql

logger = logging.getLogger("tierq.worker")

# How long a hand-over's task waits for the start being made ahead for it.
PRESTART_WAIT_S = 5.0

EXPIRED = "expired"  # SUCCEEDED, FAILED, CANCELLED: how a handler ended (running)
HANDED_BACK = "handed_back"

__all__ = ["CANCELLED", "CANCEL_POLL_S", "FAILED", "SUCCEEDED", "Handover", "Heartbeat",
           "execute", "hand_back_running"]

Clock = Callable[[], float]


def execute(
    runtime: Runtime,
    registry: HandlerRegistry,
    job_id: str,
    attempt: int,
    *,
    worker_id: str,
    clock: Clock | None = None,
    dispatched_at: float | None = None,
    handover: Handover | None = None,
    token: str | None = None,
    runs: list[int] | None = None,
) -> str:
    """Run attempt ``attempt`` of job ``job_id``; return the outcome (see module constants).
    ``runs``: given, the items of the run it led are appended to it (1: it ran alone).
    ``clock``: a virtual clock for tests (default: the runtime's, Redis's);
    ``dispatched_at``: when its lease was taken; ``handover``: how the job this slot takes
    next reaches it (None: the slot is released, and the dispatcher fills it); ``token``:
    the one its message carries (a hand-over's, whose start may be made already), else new."""
    attempt_ = _Attempt(runtime, job_id, attempt, worker_id=worker_id, clock=clock,
                        dispatched_at=dispatched_at, handover=handover, token=token)
    outcome = attempt_.run(registry)
    if runs is not None:
        runs.append(attempt_.run_items)
    return outcome


def _log_unrecorded(job_id: str, attempt: int, step: str) -> None:
    """Gave up on SQL: the lease lapses and the reaper runs the job again."""
    logger.error("job.sql_gave_up", extra={
        "event": "job.sql_gave_up", "job_id": job_id, "attempt": attempt, "step": step})


class _Attempt(HandsOver, SettlesUnstarted, RecordsOutcome):
    """One attempt of one job, dispatched to this worker."""

    def __init__(
        self,
        runtime: Runtime,
        job_id: str,
        attempt: int,
        *,
        worker_id: str,
        clock: Clock | None,
        dispatched_at: float | None = None,
        handover: Handover | None = None,
        token: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.dispatched_at = dispatched_at
        self.handover = handover
        self.job_id = job_id
        self.attempt = attempt
        self.job: Job | None = None  # the row, once read or started
        self.ctx: JobContext | None = None  # the handler's context, once it runs
        self.worker_id = worker_id
        # Names this handling's start in the row: a duplicated message's start is another's.
        self.token = token or uuid.uuid4().hex
        self._from_hand_over = token is not None
        # Owns its token (``jobs.execution.prestart``): a start under it is this handling's.
        self._owns_token = False
        # Started ahead, moments ago, under a lease this process took: no check needed first.
        self._fresh = False
        # The attempt that handed this job over, ended and committed: its lease is released
        # with this one's first renewal (one round trip for both).
        self._handed: Finished | None = None
        # Started ahead and run before the handing statement's COMMIT: no move of this
        # attempt's own before that COMMIT has landed and its first renewal is made (or is
        # its own to make: ``jobs.execution.prestart.Landing``).
        self._landed: Landing | None = None
        # This attempt's ending let the next job run before its own COMMIT: landed after it.
        self.next_landed: Landing | None = None
        self.clock: Clock = clock or runtime.clock
        self._virtual_clock = clock  # passed to lease renewals (None: the index's clock)
        self._keeper = LeaseKeeper(runtime, job_id, attempt, clock)
        # Says whether to keep waiting for SQL: the keeper before the start, the heartbeat
        # while the job runs and until its outcome is recorded.
        self._holds_lease: Callable[[], bool] = self._keeper.renew
        self.limit_s = runtime.policy.default_timeout_s  # the row's, once started
        self.run_items = 1  # the items of its run (``jobs.execution.packing``)
        self.retries_timeout = False
        # The handler's ending and the overrun's (another thread) race: the first records.
        self._ending_lock = threading.Lock()
        self._ending_claimed = False

    def run(self, registry: HandlerRegistry) -> str:
        try:
            return self._run(registry)
        except SqlUnreachable:
            _log_unrecorded(self.job_id, self.attempt, "record")
            return STALE

    def _run(self, registry: HandlerRegistry) -> str:
        job = self._start()
        if job is None:
            settled = self._not_started()
            if isinstance(settled, str):
                return settled
            job = settled
        self.job = job
        self._log(logging.DEBUG, "job.started", kind=job.kind,
                  wait_s=None if job.started_at is None else job.started_at - job.enqueued_at)
        sender = ProgressSender(self.runtime, job.id)
        ctx = JobContext(
            job_id=job.id, attempt=job.attempt, tenant_id=job.tenant_id, kind=job.kind,
            reporter=sender,
        )
        self.ctx = ctx
        self.limit_s = limits.limit_s(job, self.runtime.policy, registry.timeout_s(job.kind))
        self.retries_timeout = registry.retries_timeout(job.kind)
        heartbeat = Heartbeat(self.runtime, ctx, clock=self._virtual_clock,
                              limit_s=self.limit_s,
                              grace_s=self.runtime.policy.timeout_grace_s,
                              on_overrun=lambda: self._overrun(heartbeat))
        if self._landed is not None:
            # Run while the handing statement commits; the handing task announces the start,
            # records its figures and releases its own lease in this lease's first renewal,
            # once its COMMIT has landed (``RecordsOutcome._end``).
            heartbeat.start()
        elif self._fresh or self._leased_moments_ago():
            # Leased a moment ago (by this process, or for this message): the lease cannot
            # have lapsed, so the renewal that announces the start goes first in the
            # heartbeat's thread, beside the handler (a lease lost with Redis meanwhile is
            # told the handler as a lost lease, at once).
            heartbeat.start(announce=True, start=start_figures(job), release=self._handed)
        else:
            # The lease is checked after the start, in the round trip that announces it: one
            # reaped while the message waited in the broker (or lost with Redis) means the
            # handler must not run, and the start is undone.
            heartbeat.renew_now(announce=True, start=start_figures(job), release=self._handed)
            if ctx.lease_lost():
                return self._hand_back(Status.RUNNING)
            heartbeat.start()
        self._holds_lease = heartbeat.holds_lease
        if self._landed is None:  # else announced by the handing task, after its COMMIT
            self._announce_batch()
        RUNNING.add(ctx)
        try:
            ending = self._call(registry, ctx, job, heartbeat)
            sender.close()  # the last report is in Redis before the ending is announced
            self._await_handing(fold=ending.kind in (SUCCEEDED, FAILED, CANCELLED))
            if not self._claim_ending(returned=heartbeat):
                self._log(logging.WARNING, "job.stale", reason="ended after its overrun")
                return STALE
            return self._finish(ending, heartbeat)
        finally:
            self._pay_owed()  # owed and not made: an ending that did not pass the slot on
            RUNNING.discard(ctx)
            heartbeat.stop()

    def _call(self, registry: HandlerRegistry, ctx: JobContext, job: Job,
              heartbeat: Heartbeat) -> Ending:
        """The handler's call: alone, or leading a run of its kind (``jobs.execution.packing``)."""
        packing = registry.packing(job.kind) if registry.runs(job.kind) else None
        if packing is None or ctx.cancelled():
            return call_handler(registry, ctx, job)
        policy = self.runtime.policy
        run = PackedRun(self.runtime, registry, packing, lead=job, ctx=ctx, heartbeat=heartbeat,
                        clock=self.clock, virtual=self._virtual_clock, worker_id=self.worker_id,
                        lead_limit_s=self.limit_s,
                        limit_of=lambda j: limits.limit_s(j, policy, registry.timeout_s(j.kind)),
                        on_size=self._note_run_items)
        ending = run.run()
        self.run_items, self.limit_s = run.size, run.limit_s
        return ending

    def _note_run_items(self, size: int) -> None:
        self.run_items = size

    def _claim_ending(self, *, returned: Heartbeat | None = None) -> bool:
        """True for the first of the handler's ending and the overrun's: that one records.
        ``returned``: the handler's claim, which also tells its heartbeat that only the
        recording is left, under the same lock: an overrun that finds the ending claimed
        finds the recording's own bound set too."""
        with self._ending_lock:
            claimed, self._ending_claimed = self._ending_claimed, True
            if returned is not None and not claimed:
                settings = self.runtime.settings
                returned.returned(settings.result_store_timeout_s
                                  + self.runtime.policy.timeout_grace_s)
            return not claimed

    def _overrun(self, heartbeat: Heartbeat) -> None:
        """The handler did not stop within the grace after its limit: record the attempt
        timed out (its slot passes to no job here), then end this process, which is the only
        way to stop a thread that will not return. A handler that returned meanwhile has its
        ending recorded instead, and the overrun stands down, unless that recording has
        itself passed its bound. Runs on a thread of its own."""
        stands_down = False
        try:
            if self._claim_ending():
                self.handover = None  # this process ends: the dispatcher fills the slot
                self._await_handing()
                self._timed_out(heartbeat)
            else:
                stands_down = not heartbeat.recording_overran()
        except Exception:  # the process ends all the same; the reaper settles the rest
            self._log(logging.ERROR, "job.overrun_unrecorded", exc_info=True)
        finally:
            if stands_down:
                self._log(logging.INFO, "job.overrun_stood_down", reason="ending recorded")
            else:
                limits.end_process(self.runtime.policy.stop_grace_s)

    def _leased_moments_ago(self) -> bool:
        """The message's lease was taken less than a third of its TTL ago (on the index's
        clock, as the lease was): it has not lapsed, whatever the broker's delay."""
        taken = self.dispatched_at
        return taken is not None and 0 <= self.clock() - taken < self.runtime.policy.lease_ttl_s / 3

    def _start(self) -> Job | None:
        """Queued → running, returning the row (the claim too): one statement. Waits out a database
        outage while the lease is held; after a retry, a start that already landed (the
        COMMIT's answer was lost) is found by reading the row back."""
        retried = [False]
        if self._from_hand_over:
            taken = PRE_STARTS.take(self.token, wait_s=PRESTART_WAIT_S)
            # A start made ahead whose COMMIT failed before this task took it is lost: made
            # here under the same token, as a start retried (one that landed after all is
            # found by that token), never run on the strength of a rolled-back row.
            lost = taken.landed is not None and taken.landed.lost()
            self._owns_token = taken.claim is Claim.OWN or lost
            retried[0] = lost
            if taken.claim is Claim.STARTED and not lost:
                self._fresh = taken.age < self.runtime.policy.lease_ttl_s / 3
                self._handed = taken.release
                self._landed = taken.landed
                return taken.job

        # Leased by its submit, maybe before that submit's COMMIT (PostgreSQL): wait for it.
        direct = self.runtime.direct
        committing = direct if may_be_committing(self.job_id, self.clock()) else None

        def start() -> Job | None:
            if committing is not None and not retried[0]:
                with jobs_sql.once_committed(committing, self.job_id,
                                             wait_s=UNCOMMITTED_WAIT_S) as committed:
                    return None if committed is None else jobs_sql.start(
                        committed, self.job_id, attempt=self.attempt, now=self.clock(),
                        token=self.token, dispatched_at=self.dispatched_at)
            # Not durable: a start lost with the database's crash leaves the row queued at
            # this attempt, and the ending makes it again with itself while the lease is
            # held (``_end_lost_start``). Its commit is made durable by the next durable one.
            with self.runtime.one_statement(durable=False) as session:
                job = jobs_sql.start(session, self.job_id, attempt=self.attempt,
                                     now=self.clock(), token=self.token,
                                     dispatched_at=self.dispatched_at)
                if job is None and retried[0]:
                    # Only this handling's own start: a copy of the message elsewhere may
                    # have started the same attempt, and that start is not ours to run.
                    return jobs_sql.started_by(session, self.job_id, attempt=self.attempt,
                                               token=self.token)
                return job

        def keep_trying() -> bool:
            retried[0] = True
            return self._holds_lease()

        return retry_sql(start, keep_trying=keep_trying, what="start", job_id=self.job_id)

    def _hand_back(self, src: Status, reason: str = "lease gone before the start",
                   **extra: Any) -> str:
        """Give a job whose lease is gone back to the queue before its handler ran: a new
        attempt, not charged (a start just made is undone; ``started_at`` is cleared when it
        was the first start, else the earlier start's time is not known here and stays the
        latest). The CAS decides against the reaper doing the same; whoever moves the row
        indexes it (else the reconciler will)."""
        job = self._job
        uncharge = jobs_sql.unstart_fields(job) if src is Status.RUNNING else {}
        if not self._transition(src, Status.QUEUED, **uncharge, **extra):
            self._log(logging.INFO, "job.stale", reason="lease gone, job moved on")
            return STALE
        try:
            self.runtime.index.requeue(entry_of(job, attempt=job.attempt + 1))
        except redis.RedisError:
            self._log(logging.ERROR, "job.requeue_failed", exc_info=True)
        ring(self.runtime)
        self._log(logging.WARNING, "job.handed_back", reason=reason)
        return HANDED_BACK

    @property
    def _job(self) -> Job:
        assert self.job is not None, "the row is read before any state change"
        return self.job

    def _transition(
        self, src: Status, dst: Status, *, announce: bool = True, unsure: bool = False,
        **fields: Any,
    ) -> bool:
        """The CAS, waiting out a database outage while the lease is held. After a retry, a
        CAS that finds its own change already made (the commit landed, its answer was lost)
        counts as done; ``unsure``: a statement making this change may have landed already,
        so look first."""
        job, retried = self._job, [unsure]

        def cas() -> bool:
            if not retried[0]:  # the hot path: one statement on a Core connection
                with self.runtime.one_statement() as connection:
                    return jobs_sql.transition(
                        connection, job.id, src=src, attempt=job.attempt, dst=dst,
                        now=self.clock(), **fields,
                    )
            with self.runtime.sessions.begin() as session:
                if jobs_sql.landed(session, job, src, dst):
                    return True
                return jobs_sql.transition(
                    session, job.id, src=src, attempt=job.attempt, dst=dst,
                    now=self.clock(), **fields,
                )

        def keep_trying() -> bool:
            retried[0] = True
            return self._holds_lease()

        moved = retry_sql(cas, keep_trying=keep_trying, what=f"{src.value}->{dst.value}",
                          job_id=job.id)
        if moved and announce:
            self._announce()
        return moved

    def _announce(self) -> None:
        """After a commit: wake long-polls of this job (best effort), and its batch's event
        streams."""
        notify.announce(self.runtime.redis, self.runtime.prefix, [self.job_id])
        self._announce_batch()

    def _announce_batch(self) -> None:
        """A batch item moved: its batch's event streams read the counts again."""
        batch_id = None if self.job is None else self.job.batch_id
        if batch_id is not None:
            notify.announce_batches(self.runtime.redis, self.runtime.prefix, [batch_id])

    def _log(self, level: int, event: str, *, exc_info: bool = False, **fields: Any) -> None:
        log_job(level, event, self._job, worker_id=self.worker_id, exc_info=exc_info, **fields)
