"""The handler contract: what a job of each kind does, and how it says how it ended.

No Celery here: the API validates payloads with it at submit time, and the worker
(``jobs.execution.attempt``) runs it; ``jobs.execution.registry`` finds handlers by kind. A
handler is any object with a ``kind``, a ``validate(payload)`` and a ``run(ctx, payload)``;
``run`` returns a JSON value (the result).

A handler ends a job by what it does:

- returns a value: the job succeeded with that result;
- raises ``RetryableError``: the job is tried again later (until its attempts are spent);
- raises ``JobCancelled`` (``ctx.check()`` does), or returns or raises anything after
  ``ctx.cancelled()``: the job ends cancelled;
- raises ``LeaseLost`` (``ctx.check()`` does once the lease is lost): nothing is recorded,
  the reaper re-queues the job;
- raises ``JobTimedOut`` (``ctx.check()`` does once the attempt passed its run-time limit),
  or returns or raises anything after ``ctx.timed_out()``: the attempt timed out (retried
  when the handler's ``retry_on_timeout`` is true and starts remain, else ``failed``);
- raises anything else: the job failed with ``"<ExceptionType>: <message>"``.

A handler may also declare ``timeout_s`` (its kind's run-time limit, used when a job names
none), ``retry_on_timeout`` (False by default), and ``setup()``: run once in each worker
process before it takes a job (load a model, warm a device), so no job pays for it. A
handler that ignores the stop its limit asks for is ended with the process running it,
``policy.timeout_grace_s`` later.

Packing (``PackingHandler``): a GPU does many small items of one kind in one pass for little
more than the cost of one, so a handler may declare ``max_items_per_run`` (2 or more turns
packing on for its kind; the configuration's ``[kinds."<kind>"]`` overrides it), optionally
``max_cost_per_run`` with ``cost(payload) -> int`` (a budget in its own units: characters,
tokens), and implement ``run_many(contexts, payloads)``. It returns one outcome per item, in
order: a result, or an exception instance (that item ends as if ``run`` had raised it: a
``RetryableError`` is retried, anything else fails it). A ``run_many`` that raises fails the
whole run: the worker splits it until the item that breaks it runs alone, and charges that
item only. Each item has its own ``JobContext`` (its progress, its cancel); the worker marks
a stop of the whole run (lease lost, timed out, handed back) on every context of the run,
a cancel on its item's only. ``check_run(contexts)`` between batches raises the first and
names the items still wanted. A handler without ``run_many`` runs one job at a time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobs.core.errors import InvalidRequest
from jobs.core.progress import Report

MAX_SLEEP_S = 3600.0


class RetryableError(Exception):
    """Raised by a handler to ask for another attempt later (with backoff)."""


class JobInterrupted(Exception):
    """The job must stop: raised by ``JobContext.check`` once it is cancelled or lost."""


class JobCancelled(JobInterrupted):
    """Cancellation was requested: the job ends ``cancelled``."""


class WorkerStopping(JobInterrupted):
    """The worker is stopping and the job cannot finish in its grace: it goes back to the
    queue, uncharged, for another worker."""


class LeaseLost(JobInterrupted):
    """The lease was lost (reaped): another attempt owns the job, this one must not write."""


class JobTimedOut(JobInterrupted):
    """The attempt ran past its run-time limit (``timeout_s``): it ends ``timed_out``."""


@dataclass(frozen=True, kw_only=True)
class JobContext:
    """What a running handler may know and ask about its job.

    The worker's heartbeat sets the flags; ``sleep`` wakes early when either is set, so a
    cooperative handler stops within a heartbeat tick of a cancel request.
    """

    job_id: str
    attempt: int
    tenant_id: str
    kind: str
    _cancel: threading.Event = field(
        default_factory=threading.Event, init=False, repr=False, compare=False
    )
    _lost: threading.Event = field(
        default_factory=threading.Event, init=False, repr=False, compare=False
    )
    _stop: threading.Event = field(
        default_factory=threading.Event, init=False, repr=False, compare=False
    )
    _handback: threading.Event = field(
        default_factory=threading.Event, init=False, repr=False, compare=False
    )
    _timeout: threading.Event = field(
        default_factory=threading.Event, init=False, repr=False, compare=False
    )
    # Where ``progress`` reports go (the worker's: Redis, throttled); None: kept here only.
    reporter: Callable[[Report], None] | None = field(default=None, repr=False, compare=False)
    _last_report: Report | None = field(default=None, init=False, repr=False, compare=False)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the job got: ``fraction`` from 0 to 1, and a short ``message``
        ("chunk 40 of 100"). Cheap enough to call per item: reports reach Redis a few times
        a second at most (the latest always does), never SQL; the last one is stored with
        the job's ending. ``ValueError`` for a fraction outside 0–1."""
        report = Report.make(fraction, message, at=time.time(), attempt=self.attempt)
        object.__setattr__(self, "_last_report", report)  # the context's one mutable field
        if self.reporter is not None:
            self.reporter(report)

    @property
    def last_report(self) -> Report | None:
        return self._last_report

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def lease_lost(self) -> bool:
        return self._lost.is_set()

    def timed_out(self) -> bool:
        """The attempt passed its run-time limit: whatever it does now ends it timed out."""
        return self._timeout.is_set()

    def handed_back(self) -> bool:
        """The worker is stopping: the job goes back to the queue."""
        return self._handback.is_set()

    def stopped(self) -> bool:
        """Cancelled, timed out, lease lost or handed back: further work here is wasted."""
        return self._stop.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds``; False when woken early because the job must stop."""
        return not self._stop.wait(max(0.0, seconds))

    def check(self) -> None:
        """Raise ``JobCancelled``, ``JobTimedOut`` or ``LeaseLost`` when the job must stop."""
        if self._lost.is_set():
            raise LeaseLost(f"the lease of job {self.job_id} attempt {self.attempt} was lost")
        if self._handback.is_set():
            raise WorkerStopping(f"the worker running job {self.job_id} is stopping")
        if self._timeout.is_set():
            raise JobTimedOut(f"job {self.job_id} attempt {self.attempt} ran past its "
                              "run-time limit")
        if self._cancel.is_set():
            raise JobCancelled(f"job {self.job_id} was cancelled")

    def mark_cancelled(self) -> None:
        self._cancel.set()
        self._stop.set()

    def mark_timed_out(self) -> None:
        self._timeout.set()
        self._stop.set()

    def mark_lease_lost(self) -> None:
        self._lost.set()
        self._stop.set()

    def mark_handed_back(self) -> None:
        self._handback.set()
        self._stop.set()


class Handler(Protocol):
    """What a job of a kind does. Optional, found by name: ``timeout_s``,
    ``retry_on_timeout``, ``setup()``, and for packing the members of ``PackingHandler``."""

    kind: str

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The normalised payload; raise ``InvalidRequest`` (with ``details``) when bad."""
        ...

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        """Do the work; return a JSON-serialisable result."""
        ...


class PackingHandler(Handler, Protocol):
    """A handler whose kind packs: several queued items of it share one run of a slot.

    ``max_items_per_run``: 2 or more packs (the registry's ``packing(kind)`` applies the
    configuration's override). A handler with a budget also has ``max_cost_per_run: int`` and
    ``cost(payload) -> int``; the first item of a run always fits, however large.
    """

    max_items_per_run: int

    def run_many(self, contexts: list[JobContext], payloads: list[dict[str, Any]]) -> list[Any]:
        """One outcome per item, in order: its result, or an exception instance that ends
        that item as if ``run`` had raised it (a cancelled item's: ``JobCancelled``). Raise
        only for what breaks the whole run. Call ``check_run(contexts)`` between batches."""
        ...


def check_run(contexts: Sequence[JobContext]) -> list[int]:
    """The indexes of the run's items still wanted (not cancelled); raise ``LeaseLost``,
    ``WorkerStopping`` or ``JobTimedOut`` (the gravest, in that order) when the whole run
    must stop: the worker marks those on every context of the run. A run whose items are
    all cancelled gets ``[]``: the handler returns their ``JobCancelled`` outcomes."""
    for stop in (JobContext.lease_lost, JobContext.handed_back, JobContext.timed_out):
        for ctx in contexts:  # the gravest first: a lost lease may write nothing at all
            if stop(ctx):
                ctx.check()
    return [index for index, ctx in enumerate(contexts) if not ctx.cancelled()]


# -- built-in handlers -----------------------------------------------------------------------


class _SleepPayload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    seconds: Annotated[float, Field(ge=0, le=MAX_SLEEP_S, allow_inf_nan=False)]
    fail: bool = False


class SleepHandler:
    """Holds a worker slot like real GPU work; sleeps through ``ctx.sleep`` so a cancel
    stops it. ``fail: true`` raises a non-retryable error once the time has passed. A sleep
    of ``REPORTS_FROM_S`` or more reports its progress every second."""

    kind = "sleep"
    REPORTS_FROM_S = 5.0

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return parse_payload(_SleepPayload, payload)

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        seconds = float(payload["seconds"])
        step = 1.0 if seconds >= self.REPORTS_FROM_S else seconds
        slept = 0.0
        while slept < seconds:
            nap = min(step, seconds - slept)
            if not ctx.sleep(nap):
                ctx.check()
            slept += nap
            if step < seconds:
                ctx.progress(min(1.0, slept / seconds), f"{slept:g} of {seconds:g} s")
        if payload.get("fail"):
            raise RuntimeError(f"sleep of {seconds:g} s failed on request (fail=true)")
        return {"slept": seconds}


class EchoHandler:
    """Returns its payload: any JSON object."""

    kind = "echo"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            normalised: dict[str, Any] = json.loads(json.dumps(payload, allow_nan=False))
        except (TypeError, ValueError) as exc:
            details = [{"loc": ["payload"], "msg": f"not a JSON object: {exc}"}]
            raise invalid_payload(details) from None
        return normalised

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        return payload


def parse_payload(model: type[BaseModel], payload: dict[str, Any]) -> dict[str, Any]:
    """Validate ``payload`` with a pydantic model; errors become ``InvalidRequest`` whose
    ``details`` locate each field from the request body (``["payload", "seconds"]``)."""
    try:
        return model.model_validate(payload).model_dump()
    except ValidationError as exc:
        details = [
            {"loc": ["payload", *err["loc"]], "msg": err["msg"]} for err in exc.errors()
        ]
        raise invalid_payload(details) from None


def invalid_payload(details: list[dict[str, Any]]) -> InvalidRequest:
    """The ``InvalidRequest`` for ``details``, its message naming the first."""
    first = details[0]
    where = ".".join(str(part) for part in first["loc"])
    return InvalidRequest(f"invalid payload: {where}: {first['msg']}", details=details)
