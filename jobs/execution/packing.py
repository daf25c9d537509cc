"""A packed run, the worker's side: the slot's first item (the lead, started as any job is by
``jobs.execution.attempt``) is joined by queued jobs of its kind, and the handler's
``run_many`` runs them all in one call; each item keeps its own row, lease, outcome and events.

- **Fill**: one read of the kind's queued jobs in dispatch order (``jobs.store.runs``), then
  the index leases those that may join, in the pool's order and under the tenants' caps
  (``fill_run``, one script): packing never changes which job a slot starts first.
- **Start**: the riders start in one statement (their claim, as a lone start is); each start
  is announced and its figures recorded in the renewal that follows it. A rider whose start
  moved nothing (cancelled, late, moved) goes back to the index as it was leased.
- **Run**: one handler call; the lead's heartbeat renews the riders' leases too and tells
  each of its cancel; the run's limit is the smallest of its items'.
- **End**: the riders' endings in one transaction, then their leases released; the lead's
  ending is returned to its attempt, which records it and passes the slot on as always.

A run that fails as a whole (``run_many`` raises, answers the wrong number of outcomes, or
passes its limit) is split: every item goes back to the queue uncharged, bounded to runs of
half the size (``jobs.core.packing.split_cap``), until the item that breaks it runs alone and
is charged as any lone job. A process that dies mid-run leaves its items to the reaper, which
splits them the same way (``jobs.dispatch.recovery``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import sqlalchemy.exc as sa_exc

from jobs.core.domain import Job
from jobs.core.error_types import ErrorType
from jobs.core.packing import Packing, may_join, run_size, split_cap
from jobs.core.policy import retry_backoff_s
from jobs.core.states import Status
from jobs.execution.handlers import (
    JobCancelled,
    JobContext,
    JobTimedOut,
    LeaseLost,
    RetryableError,
    WorkerStopping,
)
from jobs.execution.leases import Heartbeat, retry_sql, start_figures
from jobs.execution.progress import ProgressSender
from jobs.execution.registry import HandlerRegistry
from jobs.execution.results import result_fields
from jobs.execution.running import (
    CANCELLED,
    FAILED,
    RUNNING,
    SUCCEEDED,
    TIMED_OUT,
    Ending,
    call_handler,
    cut_error,
    describe_error,
    log_job,
)
from jobs.execution.slots import entry_of, ring
from jobs.index import counters, notify
from jobs.index.base import Lease, Renewal, RunCandidate
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import runs as runs_sql

logger = logging.getLogger("tierq.worker")

# The lead's ending when its run failed as a whole: back to the queue, uncharged, bounded.
SPLIT = "split"

# Queued jobs read per place in the run: enough to fill it past tenants at their caps.
CANDIDATES_PER_ITEM = 4


@dataclass
class Rider:
    """An item of the run after its first: its row as started, its context, its reports."""

    job: Job
    ctx: JobContext
    sender: ProgressSender


class PackedRun:
    """The run one lead job leads on this slot."""

    def __init__(self, runtime: Runtime, registry: HandlerRegistry, packing: Packing, *,
                 lead: Job, ctx: JobContext, heartbeat: Heartbeat,
                 clock: Callable[[], float], virtual: Callable[[], float] | None,
                 worker_id: str, lead_limit_s: float,
                 limit_of: Callable[[Job], float],
                 on_size: Callable[[int], None] = lambda size: None) -> None:
        self.runtime = runtime
        self.registry = registry
        self.packing = packing
        self.lead = lead
        self.ctx = ctx
        self.heartbeat = heartbeat
        self.clock = clock
        self._virtual = virtual
        self.worker_id = worker_id
        self.limit_s = lead_limit_s
        self._limit_of = limit_of
        # Told the run's size once its riders started: an overrun, on another thread, ends
        # a run of several as one that failed as a whole.
        self._on_size = on_size
        self.riders: list[Rider] = []

    @property
    def size(self) -> int:
        return 1 + len(self.riders)

    def run(self) -> Ending:
        """Fill, start and run the run; record the riders; the lead's ending."""
        leases = self._fill()
        if leases:
            self._start(leases)
        self._note_run()
        if not self.riders:
            return call_handler(self.registry, self.ctx, self.lead)
        self._on_size(self.size)
        for rider in self.riders:
            RUNNING.add(rider.ctx)
        try:
            self.limit_s = min([self.limit_s, *(self._limit_of(r.job) for r in self.riders)])
            self.heartbeat.tighten(self.limit_s)
            self.heartbeat.riders = self._renew_riders
            endings = self._call()
            for rider in self.riders:
                rider.sender.close()
            self._record([(rider, endings[i + 1]) for i, rider in enumerate(self.riders)])
            return endings[0]
        finally:
            self.heartbeat.riders = None
            for rider in self.riders:
                RUNNING.discard(rider.ctx)

    # -- fill and start --

    def _fill(self) -> list[Lease]:
        lead, packing = self.lead, self.packing
        size = run_size(packing.max_items, lead.run_cap)
        if size < 2:
            return []
        try:
            with self.runtime.sessions() as session:
                found = runs_sql.candidates(session, lead.kind, lead=lead.id, now=self.clock(),
                                            limit=CANDIDATES_PER_ITEM * size)
            offered = [RunCandidate(job_id=c.id, tenant=c.tenant_id,
                                    cost=self._cost(c.payload))
                       for c in found if may_join(c.run_cap, size)]
            if not offered:
                return []
            return self.runtime.index.fill_run(
                lead.id, attempt=lead.attempt, candidates=offered, max_items=size,
                max_cost=packing.max_cost, lead_cost=self._cost(lead.payload),
                lease_ttl_s=self.runtime.policy.lease_ttl_s, now=self._now())
        except (sa_exc.SQLAlchemyError, redis.RedisError):
            log_job(logging.WARNING, "run.fill_failed", lead, worker_id=self.worker_id,
                    exc_info=True)
            return []

    def _cost(self, payload: dict[str, Any]) -> int:
        try:
            return self.packing.cost_of(payload)
        except Exception:  # a payload the handler cannot price runs at its own cost: alone
            return self.packing.max_cost or 0

    def _start(self, leases: Sequence[Lease]) -> None:
        token = uuid.uuid4().hex
        pairs = [(lease.job_id, lease.attempt) for lease in leases]

        def start() -> list[Job]:
            with self.runtime.sessions.begin() as session:
                return runs_sql.start_riders(session, pairs, lead=self.lead.id,
                                             now=self.clock(), token=token,
                                             dispatched_at=None,  # leased now
                                             again=retried[0])

        retried = [False]

        def keep_trying() -> bool:
            retried[0] = True
            return self.heartbeat.holds_lease()

        try:
            started = retry_sql(start, keep_trying=keep_trying, what="run start",
                                job_id=self.lead.id)
        except Exception:
            started = []
            log_job(logging.WARNING, "run.start_failed", self.lead, worker_id=self.worker_id,
                    exc_info=True)
        ids = {job.id for job in started}
        for lease in leases:  # not started: back in the queue as it was leased
            if lease.job_id not in ids:
                self._safely(lambda lease=lease: self.runtime.index.put_back(  # type: ignore[misc]
                    lease.job_id, attempt=lease.attempt))
        renewals = self._safely(lambda: self.runtime.index.renew_many(
            [(job.id, job.attempt, start_figures(job)) for job in started],
            ttl_s=self.runtime.policy.lease_ttl_s, now=self._now(), announce=True))
        for job, renewal in zip(started, renewals or [Renewal.HELD] * len(started), strict=True):
            if renewal is Renewal.LOST:
                continue  # reaped meanwhile: the reaper has it
            sender = ProgressSender(self.runtime, job.id)
            ctx = JobContext(job_id=job.id, attempt=job.attempt, tenant_id=job.tenant_id,
                             kind=job.kind, reporter=sender)
            if renewal is Renewal.CANCEL_REQUESTED:
                ctx.mark_cancelled()
            self.riders.append(Rider(job=job, ctx=ctx, sender=sender))
        batches = {job.batch_id for job in started if job.batch_id is not None}
        if batches:
            notify.announce_batches(self.runtime.redis, self.runtime.prefix, batches)

    def _note_run(self) -> None:
        """Its size in the kind's histogram of items per run (a lone item's too: how much
        packing there is) and its items in the pool's count (best effort)."""
        log_job(logging.DEBUG, "run.started", self.lead, worker_id=self.worker_id,
                items=self.size)
        counters.record_run(self.runtime.redis, self.runtime.prefix, kind=self.lead.kind,
                            pool=self.runtime.settings.pool, items=self.size, now=self._now())

    def _renew_riders(self) -> None:
        """With each renewal of the lead's lease: the riders' leases, and their cancels."""
        held = [rider for rider in self.riders if not rider.ctx.lease_lost()]
        renewals = self._safely(lambda: self.runtime.index.renew_many(
            [(r.job.id, r.job.attempt, None) for r in held],
            ttl_s=self.runtime.policy.lease_ttl_s, now=self._now()))
        for rider, renewal in zip(held, renewals or [], strict=False):
            if renewal is Renewal.LOST:
                rider.ctx.mark_lease_lost()
            elif renewal is Renewal.CANCEL_REQUESTED and not rider.ctx.cancelled():
                rider.ctx.mark_cancelled()

    # -- the handler's call --

    def _call(self) -> list[Ending]:
        """One ending per item, the lead's first; every item's ``SPLIT`` when the run failed
        as a whole."""
        items = [(self.lead, self.ctx), *((r.job, r.ctx) for r in self.riders)]
        endings: list[Ending | None] = [None] * len(items)
        called: list[int] = []
        payloads: list[dict[str, Any]] = []
        for i, (job, _ctx) in enumerate(items):
            try:
                payloads.append(self.registry.validate(job.kind, job.payload))
                called.append(i)
            except Exception as exc:
                endings[i] = Ending(kind=FAILED, error=describe_error(exc))
        try:
            self.registry.ready(self.lead.kind)
            handler: Any = self.registry.get(self.lead.kind)
            outcomes = list(handler.run_many([items[i][1] for i in called], payloads))
        except LeaseLost:
            return [Ending(kind="lease_lost")] * len(items)
        except (WorkerStopping, JobCancelled, JobTimedOut, Exception) as exc:
            if self.ctx.handed_back():
                return [Ending(kind="handback")] * len(items)
            if not isinstance(exc, JobTimedOut) and not self.ctx.timed_out():
                log_job(logging.WARNING, "run.failed", self.lead, worker_id=self.worker_id,
                        exc_info=True, items=len(items))
            return self._split(len(items))
        if len(outcomes) != len(called):
            log_job(logging.ERROR, "run.outcomes_miscounted", self.lead,
                    worker_id=self.worker_id, items=len(called), outcomes=len(outcomes))
            return self._split(len(items))
        if self.ctx.timed_out():  # results past the limit are not kept: the limit is the contract
            return self._split(len(items))
        for i, outcome in zip(called, outcomes, strict=True):
            endings[i] = item_ending(items[i][1], outcome, items[i][0])
        return [ending or Ending(kind=FAILED) for ending in endings]

    def _split(self, n: int) -> list[Ending]:
        return [Ending(kind=SPLIT, result=split_cap(n))] * n

    # -- the riders' endings --

    def _record(self, endings: Sequence[tuple[Rider, Ending]]) -> None:
        """The riders' endings in one transaction, then their leases released (or their next
        attempts indexed); the lead's heartbeat renews their leases until then. A rider whose
        lease was lost records nothing: the reaper has it."""
        moves = [move for move in (self._move(rider, ending) for rider, ending in endings)
                 if move is not None]
        if not moves:
            return
        try:
            moved = retry_sql(lambda: self._commit(moves), keep_trying=self.heartbeat.holds_lease,
                              what="run end", job_id=self.lead.id)
        except sa_exc.DataError:
            moved = [self._commit_one(move) for move in moves]
        except Exception:
            log_job(logging.ERROR, "run.end_unrecorded", self.lead, worker_id=self.worker_id,
                    exc_info=True)
            return
        requeued = False
        released: list[tuple[str, int, str | None]] = []
        for move, did in zip(moves, moved, strict=True):
            job = move.rider.job
            if did and move.dst is Status.QUEUED:
                requeued = True
                self._safely(lambda job=job, move=move: self.runtime.index.requeue(  # type: ignore[misc]
                    entry_of(job, attempt=job.attempt + 1, not_before=move.fields.get(
                        "not_before"))))
                notify.announce(self.runtime.redis, self.runtime.prefix, [job.id])
            else:
                released.append((job.id, job.attempt, move.dst.value if did else None))
            level = logging.WARNING if move.dst is Status.FAILED else logging.INFO
            log_job(level, f"job.{move.dst.value}" if did else "job.stale", job,
                    worker_id=self.worker_id, error=move.fields.get("error"), run_items=self.size)
        if released:
            self._safely(lambda: self.runtime.index.release_many(released))
        if requeued:
            ring(self.runtime)
        batches = {m.rider.job.batch_id for m in moves if m.rider.job.batch_id is not None}
        if batches:
            notify.announce_batches(self.runtime.redis, self.runtime.prefix, batches)

    def _commit(self, moves: Sequence[_Move]) -> list[bool]:
        with self.runtime.sessions.begin() as session:
            return [self._transition(session, move) for move in moves]

    def _commit_one(self, move: _Move) -> bool:
        try:
            with self.runtime.sessions.begin() as session:
                return self._transition(session, move)
        except sa_exc.DataError as exc:
            first = str(exc.orig or exc).splitlines()[0]
            with self.runtime.sessions.begin() as session:
                return self._transition(session, _Move(rider=move.rider, dst=Status.FAILED, fields={
                    "error": cut_error(f"the job's {move.dst.value} outcome could not be "
                                       f"stored: {first}"),
                    "error_type": ErrorType.RESULT_UNSTORABLE.value}))

    def _transition(self, session: Any, move: _Move) -> bool:
        job = move.rider.job
        return jobs_sql.transition(session, job.id, src=Status.RUNNING, attempt=job.attempt,
                                   dst=move.dst, now=self.clock(), **move.fields)

    def _move(self, rider: Rider, ending: Ending) -> _Move | None:
        """What a rider's ending writes (None: nothing, its lease was lost)."""
        job, kind = rider.job, ending.kind
        fields: dict[str, Any] = {}
        report = rider.ctx.last_report
        if report is not None:
            fields["progress"] = report.to_dict()
        if kind == "lease_lost" or rider.ctx.lease_lost():
            return None
        if kind in ("handback", SPLIT, TIMED_OUT):
            fields = {**jobs_sql.unstart_fields(job)}
            if kind != "handback":  # the run failed as a whole: its items run in halves
                fields["run_cap"] = split_cap(self.size)
            return _Move(rider=rider, dst=Status.QUEUED, fields=fields)
        if kind == SUCCEEDED:
            try:
                encoded = json.dumps(ending.result, allow_nan=False, separators=(",", ":"))
            except (TypeError, ValueError) as exc:
                return _Move(rider=rider, dst=Status.FAILED, fields={
                    **fields, "error": cut_error(f"result is not JSON-serialisable: "
                                                 f"{describe_error(exc)}"),
                    "error_type": ErrorType.RESULT_UNSTORABLE.value})
            return _Move(rider=rider, dst=Status.SUCCEEDED, fields={**fields, **result_fields(
                self.runtime, encoded, clock=self.clock, job=job, worker_id=self.worker_id)})
        if kind == "retry":
            return self._retry(rider, ending.error or "RetryableError", fields)
        if kind == FAILED:
            return _Move(rider=rider, dst=Status.FAILED, fields={
                **fields, "error": ending.error, "error_type": ErrorType.HANDLER_ERROR.value})
        return _Move(rider=rider, dst=Status.CANCELLED, fields=fields)

    def _retry(self, rider: Rider, error: str, fields: dict[str, Any]) -> _Move:
        """As a lone attempt's retry: after its backoff, unless its starts are spent or the
        retry could not start before its deadline."""
        job, policy = rider.job, self.runtime.policy
        if job.starts >= job.max_attempts:
            return _Move(rider=rider, dst=Status.FAILED, fields={
                **fields, "error": cut_error(f"{error} (start {job.starts} of "
                                             f"{job.max_attempts})"),
                "error_type": ErrorType.STARTS_EXHAUSTED.value})
        not_before = self.clock() + retry_backoff_s(job.starts, policy.retry_backoff_s,
                                                    policy.retry_backoff_max_s)
        if job.start_by is not None and not_before >= job.start_by:
            return _Move(rider=rider, dst=Status.FAILED, fields={
                **fields, "error": cut_error(f"{error} (start {job.starts}; a retry could not "
                                             "start before the job's deadline, max_wait_s)"),
                "error_type": ErrorType.DEADLINE.value})
        return _Move(rider=rider, dst=Status.QUEUED, fields={**fields, "not_before": not_before})

    # -- helpers --

    def _now(self) -> float | None:
        return None if self._virtual is None else self._virtual()

    def _safely(self, call: Callable[[], Any]) -> Any:
        """One index call, best effort: a lease left behind lapses and is reaped."""
        try:
            return call()
        except redis.RedisError:
            log_job(logging.WARNING, "run.index_failed", self.lead, worker_id=self.worker_id,
                    exc_info=True)
            return None


@dataclass(frozen=True)
class _Move:
    rider: Rider
    dst: Status
    fields: dict[str, Any]


def item_ending(ctx: JobContext, outcome: Any, job: Job) -> Ending:
    """An item's outcome from ``run_many`` as ``call_handler`` turns a lone ``run``'s: an
    exception instance ends the item as if ``run`` had raised it."""
    if isinstance(outcome, BaseException):
        if isinstance(outcome, JobCancelled) or ctx.cancelled():
            return Ending(kind=CANCELLED)
        if isinstance(outcome, LeaseLost):
            return Ending(kind="lease_lost")
        if isinstance(outcome, WorkerStopping):
            return Ending(kind="handback")
        if isinstance(outcome, JobTimedOut):
            return Ending(kind=TIMED_OUT)
        if isinstance(outcome, RetryableError):
            return Ending(kind="retry", error=describe_error(outcome))
        log_job(logging.WARNING, "job.handler_error", job, error=describe_error(outcome))
        return Ending(kind=FAILED, error=describe_error(outcome))
    if ctx.cancelled():
        return Ending(kind=CANCELLED)
    return Ending(kind=SUCCEEDED, result=outcome)
