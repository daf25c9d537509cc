"""Job handlers: what a job of each kind does, and the registry that finds them by kind.

No Celery here: the API imports this module to validate payloads at submit time, and the
worker (``jobs.execution.attempt``) to run them. A handler is any object with a ``kind``, a
``validate(payload)`` and a ``run(ctx, payload)``; ``run`` returns a JSON value (the result).

A handler ends a job by what it does:

- returns a value: the job succeeded with that result;
- raises ``RetryableError``: the job is tried again later (until its attempts are spent);
- raises ``JobCancelled`` (``ctx.check()`` does), or returns or raises anything after
  ``ctx.cancelled()``: the job ends cancelled;
- raises ``LeaseLost`` (``ctx.check()`` does once the lease is lost): nothing is recorded,
  the reaper re-queues the job;
- raises anything else: the job failed with ``"<ExceptionType>: <message>"``.

Extra handlers come from two places: the entry point group ``tierq.handlers`` of every
installed package (how a package ships handlers, and how the ``models`` extra adds its own),
and ``TIERQ_HANDLERS``: comma-separated ``module:attribute`` specs (how a deployment adds a
module of its own). Each names a handler object, a handler class (built with no arguments)
or a list of them; an entry point may also name a function returning such a list. A kind
registered twice stops the process at start (docs/handlers.md).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points as installed_entry_points
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobs.core.errors import ConfigError, InvalidRequest, UnknownKind

HANDLERS_ENV = "TIERQ_HANDLERS"
ENTRY_POINT_GROUP = "tierq.handlers"
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

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def lease_lost(self) -> bool:
        return self._lost.is_set()

    def handed_back(self) -> bool:
        """The worker is stopping: the job goes back to the queue."""
        return self._handback.is_set()

    def stopped(self) -> bool:
        """Cancelled, lease lost or handed back: any further work here is wasted."""
        return self._stop.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds``; False when woken early because the job must stop."""
        return not self._stop.wait(max(0.0, seconds))

    def check(self) -> None:
        """Raise ``JobCancelled`` or ``LeaseLost`` when the job must stop."""
        if self._lost.is_set():
            raise LeaseLost(f"the lease of job {self.job_id} attempt {self.attempt} was lost")
        if self._handback.is_set():
            raise WorkerStopping(f"the worker running job {self.job_id} is stopping")
        if self._cancel.is_set():
            raise JobCancelled(f"job {self.job_id} was cancelled")

    def mark_cancelled(self) -> None:
        self._cancel.set()
        self._stop.set()

    def mark_lease_lost(self) -> None:
        self._lost.set()
        self._stop.set()

    def mark_handed_back(self) -> None:
        self._handback.set()
        self._stop.set()


class Handler(Protocol):
    kind: str

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The normalised payload; raise ``InvalidRequest`` (with ``details``) when bad."""
        ...

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        """Do the work; return a JSON-serialisable result."""
        ...


class HandlerRegistry:
    """Handlers by kind. Built once per process (``default_registry``), then read-only."""

    def __init__(self, handlers: Iterable[Handler] = ()) -> None:
        self._handlers: dict[str, Handler] = {}
        for handler in handlers:
            self.register(handler)

    def register(self, handler: Handler, *, replace: bool = False) -> None:
        if not replace and handler.kind in self._handlers:
            raise ValueError(f"a handler for kind {handler.kind!r} is already registered")
        self._handlers[handler.kind] = handler

    def get(self, kind: str) -> Handler:
        try:
            return self._handlers[kind]
        except KeyError:
            known = ", ".join(self.kinds()) or "none"
            msg = f"unknown job kind {kind!r} (known: {known})"
            raise UnknownKind(msg, details=[{"loc": ["kind"], "msg": msg}]) from None

    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def validate(self, kind: str, payload: Any) -> dict[str, Any]:
        handler = self.get(kind)
        if not isinstance(payload, dict):
            raise _invalid([{"loc": ["payload"], "msg": "the payload must be a JSON object"}])
        return handler.validate(payload)


# -- built-in handlers -----------------------------------------------------------------------


class _SleepPayload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    seconds: Annotated[float, Field(ge=0, le=MAX_SLEEP_S, allow_inf_nan=False)]
    fail: bool = False


class SleepHandler:
    """Holds a worker slot like real GPU work; sleeps through ``ctx.sleep`` so a cancel
    stops it. ``fail: true`` raises a non-retryable error once the time has passed."""

    kind = "sleep"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return parse_payload(_SleepPayload, payload)

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        seconds = float(payload["seconds"])
        if not ctx.sleep(seconds):
            ctx.check()
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
            raise _invalid([{"loc": ["payload"], "msg": f"not a JSON object: {exc}"}]) from None
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
        raise _invalid(details) from None


def _invalid(details: list[dict[str, Any]]) -> InvalidRequest:
    first = details[0]
    where = ".".join(str(part) for part in first["loc"])
    return InvalidRequest(f"invalid payload: {where}: {first['msg']}", details=details)


# -- registry construction -------------------------------------------------------------------


def builtin_handlers() -> list[Handler]:
    return [SleepHandler(), EchoHandler()]


def default_registry(extra: str | None = None, *, entry_points: bool = True) -> HandlerRegistry:
    """The built-ins, the handlers of the ``tierq.handlers`` entry points (unless
    ``entry_points=False``) and those named by ``extra`` (a ``TIERQ_HANDLERS`` spec).

    ``extra=None`` reads ``TIERQ_HANDLERS`` from the environment; ``""`` adds nothing.
    """
    spec = os.environ.get(HANDLERS_ENV, "") if extra is None else extra
    registry = HandlerRegistry(builtin_handlers())
    sources: list[tuple[str, list[Handler]]] = []
    if entry_points:
        sources.extend(load_entry_points())
    sources.append((HANDLERS_ENV, load_handlers(spec)))
    for where, handlers in sources:
        for handler in handlers:
            if handler.kind in registry.kinds():
                raise ConfigError(f"{where}: kind {handler.kind!r} is registered twice")
            registry.register(handler)
    return registry


def load_entry_points() -> list[tuple[str, list[Handler]]]:
    """``(where, handlers)`` for each entry point of the ``tierq.handlers`` group."""
    found: list[tuple[str, list[Handler]]] = []
    seen: set[tuple[str, str]] = set()
    for point in sorted(installed_entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        if (point.name, point.value) in seen:
            continue  # one package seen twice on the path (an editable install and a wheel)
        seen.add((point.name, point.value))
        where = f"entry point {ENTRY_POINT_GROUP}:{point.name} ({point.value})"
        try:
            value = point.load()
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{where}: cannot load: {exc}") from None
        if callable(value) and not isinstance(value, type) and not hasattr(value, "kind"):
            value = value()
        values = list(value) if isinstance(value, list | tuple) else [value]
        found.append((where, [_as_handler(where, v) for v in values]))
    return found


def load_handlers(spec: str) -> list[Handler]:
    """The handlers named by a comma-separated ``module:attribute`` list."""
    handlers: list[Handler] = []
    for item in (part.strip() for part in spec.split(",")):
        if item:
            handlers.extend(_load_one(item))
    return handlers


def _load_one(item: str) -> list[Handler]:
    module_name, sep, attribute = item.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"{HANDLERS_ENV}: {item!r} is not of the form module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{HANDLERS_ENV}: cannot import {module_name!r}: {exc}") from None
    try:
        value = getattr(module, attribute)
    except AttributeError:
        raise ConfigError(f"{HANDLERS_ENV}: {module_name!r} has no {attribute!r}") from None
    values = list(value) if isinstance(value, list | tuple) else [value]
    return [_as_handler(item, v) for v in values]


def _as_handler(item: str, value: Any) -> Handler:
    where = item if item.startswith("entry point") else f"{HANDLERS_ENV}: {item!r}"
    if isinstance(value, type):
        try:
            value = value()
        except TypeError as exc:
            raise ConfigError(f"{where}: cannot build it: {exc}") from None
    kind = getattr(value, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{where} has no 'kind' string")
    for method in ("validate", "run"):
        if not callable(getattr(value, method, None)):
            raise ConfigError(f"{where} has no {method}() method")
    handler: Handler = value
    return handler
