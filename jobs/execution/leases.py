"""Keeping a job's lease from the worker's side, and waiting out a database outage under it.

A worker holds a job only as long as its lease lives: ``Heartbeat`` renews it while the
handler runs (and learns of a cancel request or a reaped lease from the renewal);
``LeaseKeeper`` renews it by hand while the worker waits for SQL before the job has
started. ``retry_sql`` retries a read or compare-and-set with backoff while SQL cannot be
reached, for as long as the lease is held: a result in hand is recorded once the database
is back, not thrown away. Once the lease is lost, the reaper owns the job, and the CAS on
``attempt`` rejects any late write.

A lease belongs to one attempt: every renewal names it, so a zombie of an earlier attempt
can never keep the next attempt's lease alive, and once lost a lease is never renewed again.
Expiries are computed by the index on Redis's clock (a ``clock`` given here is a virtual one,
for tests); the intervals between renewals are measured with ``time.monotonic()``, so a host
whose wall clock jumps or is skewed changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
import sqlalchemy.exc
import tenacity

from jobs.core.domain import Job
from jobs.core.errors import TierqError
from jobs.core.histograms import StartFigures
from jobs.execution.handlers import JobContext
from jobs.execution.renewer import RENEWER
from jobs.index.base import Finished, Renewal
from jobs.process.runtime import Runtime

logger = logging.getLogger("tierq.worker")

# How often a running job's lease is renewed, at most, and so how soon it sees a cancel.
CANCEL_POLL_S = 1.0
# Backoff between tries of a read or CAS while SQL cannot be reached.
SQL_RETRY_MIN_S = 0.1
SQL_RETRY_MAX_S = 2.0

Clock = Callable[[], float]
T = TypeVar("T")


class SqlUnreachable(TierqError):
    """SQL stayed unreachable until the lease was lost: the reaper has the job now."""


def is_sql_outage(exc: BaseException) -> bool:
    """Errors that mean the database cannot be reached right now (worth waiting out)."""
    outage = (
        sqlalchemy.exc.OperationalError,
        sqlalchemy.exc.InterfaceError,
        sqlalchemy.exc.TimeoutError,
    )
    if isinstance(exc, outage):
        return True
    return isinstance(exc, sqlalchemy.exc.DBAPIError) and bool(exc.connection_invalidated)


def retry_sql(call: Callable[[], T], *, keep_trying: Callable[[], bool], what: str,
              job_id: str) -> T:
    """``call()``, tried again with backoff while SQL cannot be reached and
    ``keep_trying()`` (asked after each failure: it renews or checks the lease) says so;
    raises ``SqlUnreachable`` once it says no. The first try runs bare: the retry machinery
    is built only once the database has failed (it costs more than a statement)."""
    try:
        return call()
    except Exception as exc:
        if not is_sql_outage(exc):
            raise
        first = exc
    _log_sql_wait(job_id, what, 1)
    if not keep_trying():
        raise SqlUnreachable(f"{what}: the database stayed unreachable") from first
    time.sleep(SQL_RETRY_MIN_S)

    def log_wait(state: tenacity.RetryCallState) -> None:
        _log_sql_wait(job_id, what, state.attempt_number + 1)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_sql_outage),
        wait=tenacity.wait_exponential(multiplier=SQL_RETRY_MIN_S, max=SQL_RETRY_MAX_S),
        stop=lambda _state: not keep_trying(),
        before_sleep=log_wait,
        reraise=True,
    )
    try:
        return retrying(call)
    except Exception as exc:
        if is_sql_outage(exc):
            raise SqlUnreachable(f"{what}: the database stayed unreachable") from exc
        raise


def _log_sql_wait(job_id: str, what: str, tries: int) -> None:
    logger.warning("job.sql_unavailable", extra={
        "event": "job.sql_unavailable", "job_id": job_id, "step": what, "tries": tries,
    })


def virtual_now(clock: Clock | None) -> float | None:
    return None if clock is None else clock()


class LeaseKeeper:
    """Renews the lease by hand while the worker waits for SQL, before the heartbeat runs.
    ``renew`` says whether waiting longer still makes sense: the lease is held."""

    def __init__(
        self, runtime: Runtime, job_id: str, attempt: int, clock: Clock | None = None
    ) -> None:
        self._runtime = runtime
        self._job_id = job_id
        self._attempt = attempt
        self._clock = clock
        self._renewed_at: float | None = None

    def renew(self) -> bool:
        now = time.monotonic()
        ttl = self._runtime.policy.lease_ttl_s
        try:
            renewed = self._runtime.index.renew(
                self._job_id, attempt=self._attempt, ttl_s=ttl, now=virtual_now(self._clock)
            )
        except redis.RedisError:  # Redis down too: wait as long as the lease lasts
            return self._renewed_at is not None and now - self._renewed_at < ttl
        if renewed:
            self._renewed_at = now
        return renewed


class Heartbeat:
    """Keeps a running job's lease alive and tells it of a cancel request and of its
    run-time limit.

    The process's renewer (``jobs.execution.renewer``) renews the lease every
    ``min(poll_s, lease_ttl_s / 3)``; each
    renewal also answers whether a cancel was requested (``Renewal.CANCEL_REQUESTED``: the
    API flags the lease after recording the request in SQL), so a running job costs the
    database nothing while it runs, and a database that hangs never holds up a renewal. A
    renewal refused (the lease was reaped, or belongs to another attempt now) marks the lease
    lost, and a lost lease is never renewed again.

    With ``limit_s``, the handler is asked to stop once the attempt has run that long
    (``JobContext.mark_timed_out``), and ``grace_s`` later the lease is renewed no more and
    ``on_overrun`` is called, once, on a thread of its own (``jobs.execution.limits``).
    The limit bounds the handler, not the recording of its outcome: once the handler has
    returned (``returned``), the lease is renewed while its ending is recorded, and the
    overrun comes only when that recording passes a bound of its own.
    """

    def __init__(
        self,
        runtime: Runtime,
        ctx: JobContext,
        *,
        clock: Clock | None = None,
        poll_s: float = CANCEL_POLL_S,
        limit_s: float | None = None,
        grace_s: float = 0.0,
        on_overrun: Callable[[], None] | None = None,
    ) -> None:
        self._runtime = runtime
        self._ctx = ctx
        self._clock = clock
        self._ttl = runtime.policy.lease_ttl_s
        self.renew_every_s = min(poll_s, self._ttl / 3)
        self._renewed_at = time.monotonic()  # the worker renewed just before the start
        self._began = self._renewed_at
        self._limit_s = limit_s
        self._grace_s = grace_s
        self._on_overrun = on_overrun
        self._overran = False
        # Once the handler returned: when its recording must be done (``time.monotonic()``).
        self._record_by: float | None = None
        self._limit_lock = threading.Lock()  # the overrun's decision and ``returned``
        self._first: tuple[bool, StartFigures | None, Finished | None] | None = None
        self._first_lock = threading.Lock()  # the first renewal is made once, by either side
        # A packed run's (``jobs.execution.packing``): renews its riders' leases after each
        # renewal of this one, and tells each of its cancel.
        self.riders: Callable[[], None] | None = None

    def tighten(self, limit_s: float) -> None:
        """A packed run's limit is the smallest of its items': never longer than set."""
        with self._limit_lock:
            if self._limit_s is None or limit_s < self._limit_s:
                self._limit_s = limit_s

    def start(self, *, announce: bool = False, start: StartFigures | None = None,
              release: Finished | None = None) -> None:
        """Renew every ``renew_every_s`` from now on (``jobs.execution.renewer``: the
        process's one renewing thread); ``announce``, ``start`` or ``release``: renew at
        once first, with those (``renew_now``), beside the handler."""
        first = announce or start is not None or release is not None
        self._first = (announce, start, release) if first else None
        RENEWER.add(self, now=first)

    def stop(self) -> None:
        """Stop renewing: no renewal follows (one in progress is waited for), so none
        follows a release. A first renewal the renewer has not made yet (a handler that
        ended at once) is made here: it announces the start, records its figures, and
        releases the lease of the attempt that handed the job over.

        ``on_overrun`` is let go: no tick can call it any more, and it refers back to the
        attempt that refers to this heartbeat. Kept, that cycle would leave each ended
        attempt (its context, events and locks: some 65 objects) to the cyclic garbage
        collector, whose full passes then stall every slot of the worker for 100 ms and
        more."""
        RENEWER.remove(self)
        self._on_overrun = None
        self.tick(first_only=True)

    def due_in(self) -> float:
        """Seconds until the renewer should tick again: the renewal period, or sooner when
        the run-time limit, the end of its grace or the recording's bound comes first."""
        if self._limit_s is None or self._overran:
            return self.renew_every_s
        now = time.monotonic()
        if self._record_by is not None:
            return max(0.0, min(self.renew_every_s, self._record_by - now))
        ran = now - self._began
        step = self._limit_s if ran < self._limit_s else self._limit_s + self._grace_s
        return max(0.0, min(self.renew_every_s, step - ran))

    def returned(self, record_s: float) -> None:
        """The handler returned, and its ending is claimed: its limit no longer applies. The
        lease is renewed while the ending is recorded, until the later of the limit's grace
        and ``record_s`` from now; past that, the overrun comes as for a handler that would
        not stop (a recording that hangs, a store or database that never answers). An
        overrun already decided stands down (``recording_overran``)."""
        if self._limit_s is None:
            return
        with self._limit_lock:
            now = time.monotonic()
            graced = self._began + self._limit_s + self._grace_s
            self._record_by = max(graced, now + record_s)
            self._overran = False

    def recording_overran(self) -> bool:
        """Asked by an overrun that found the handler's ending claimed: True when the
        recording has passed its bound (the process must end); else the overrun stands
        down and renewals go on."""
        with self._limit_lock:
            if self._record_by is not None and time.monotonic() >= self._record_by:
                return True
            self._overran = False
            return False

    def tick(self, *, first_only: bool = False) -> None:
        """One renewal, by the renewer: the first one's ``announce``, ``start`` and
        ``release`` once. ``first_only``: only that first one, if it is still to be made.
        Past the limit and its grace, no renewal: the overrun is handled instead."""
        if not first_only and self._past_limit():
            return
        with self._first_lock:
            first, self._first = self._first, None
            if first is None and first_only:
                return
            announce, start, release = first if first is not None else (False, None, None)
            try:
                self.renew_now(announce=announce, start=start, release=release)
            except Exception:  # the heartbeat must outlive any one failed step
                logger.exception("job.heartbeat_error", extra={
                    "event": "job.heartbeat_error", "job_id": self._ctx.job_id})

    def _past_limit(self) -> bool:
        """Tell the handler of its limit when it has come; True once the grace after it has
        passed too (the overrun started, on its own thread), or, the handler returned, once
        the recording of its ending has passed its bound."""
        if self._limit_s is None:
            return False
        with self._limit_lock:
            if self._overran:
                return True
            now = time.monotonic()
            if self._record_by is not None:
                if now < self._record_by:
                    return False
                event = "job.record_overrun"
            else:
                ran = now - self._began
                if ran < self._limit_s:
                    return False
                if not self._ctx.timed_out():
                    self._ctx.mark_timed_out()
                    self._warn("job.timed_out", limit_s=self._limit_s, grace_s=self._grace_s)
                if ran < self._limit_s + self._grace_s:
                    return False
                event = "job.overrun"
            self._overran = True
        self._warn(event, limit_s=self._limit_s, grace_s=self._grace_s)
        if self._on_overrun is not None:
            threading.Thread(target=self._on_overrun, name="run-limit", daemon=True).start()
        return True

    def first_renewed(self) -> None:
        """The first renewal made, by the renewer or here now: before this job's slot
        passes on, the lease of the job that handed it this slot must be released, or the
        pool would still count it."""
        self.tick(first_only=True)

    def holds_lease(self) -> bool:
        """Not lost, and renewed within its TTL: this attempt may still record its outcome."""
        return not self._ctx.lease_lost() and time.monotonic() - self._renewed_at < self._ttl

    def renew_now(self, *, announce: bool = False, start: StartFigures | None = None,
                  release: Finished | None = None) -> None:
        """Renew at once; ``announce``: also publish that the job's status moved (the
        worker's start), in the same round trip; ``start``: record the start's figures
        (``jobs.index.counters``) in it too; ``release``: release first the lease of the
        attempt that handed this job over (``renew_checked``)."""
        if not self._ctx.lease_lost():
            self._renew(time.monotonic(), announce=announce, start=start, release=release)

    def _renew(
        self, now: float, *, announce: bool = False, start: StartFigures | None = None,
        release: Finished | None = None,
    ) -> None:
        try:
            renewal = self._runtime.index.renew_checked(
                self._ctx.job_id, attempt=self._ctx.attempt, ttl_s=self._ttl,
                now=virtual_now(self._clock), announce=announce, start=start, release=release,
            )
        except redis.RedisError:
            self._warn("job.renew_failed", exc_info=True)
            return
        self._renewed_at = now
        riders = self.riders
        if riders is not None and renewal is not Renewal.LOST:
            riders()
        if renewal is Renewal.LOST:
            self._ctx.mark_lease_lost()
            self._warn("job.lease_lost")
        elif renewal is Renewal.CANCEL_REQUESTED and not self._ctx.cancelled():
            self._ctx.mark_cancelled()
            logger.info("job.cancel_seen", extra={
                "event": "job.cancel_seen", "job_id": self._ctx.job_id,
                "attempt": self._ctx.attempt})

    def _warn(self, event: str, *, exc_info: bool = False, **fields: Any) -> None:
        extra = {"event": event, "job_id": self._ctx.job_id, "attempt": self._ctx.attempt}
        logger.warning(event, extra={**extra, **fields}, exc_info=exc_info)


def start_figures(job: Job) -> StartFigures | None:
    """The queue wait (started - enqueued) and dispatch latency (started - dispatched) of a
    start, as recorded with the renewal that announces it."""
    if job.started_at is None:
        return None
    dispatch_s = None if job.dispatched_at is None else job.started_at - job.dispatched_at
    return StartFigures(wait_s=job.started_at - job.enqueued_at, dispatch_s=dispatch_s)
