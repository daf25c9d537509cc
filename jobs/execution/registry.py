"""The handler registry: finds a job's handler by its kind, built once per process.

Apart from the contract (``jobs.execution.handlers``) because it is how a process is put
together, not what a handler author writes against. Extra handlers come from two places: the
entry point group ``tierq.handlers`` of every installed package (how a package ships handlers,
and how the ``models`` extra adds its own), and ``TIERQ_HANDLERS``: comma-separated
``module:attribute`` specs (how a deployment adds a module of its own). Each names a handler
object, a handler class (built with no arguments) or a list of them; an entry point may also
name a function returning such a list. A kind registered twice stops the process at start
(docs/handlers.md).

A kind packs (``packing``) when its handler has ``run_many`` and 2 or more items per run: its
own ``max_items_per_run``, or the configuration's (``configure_packing``: the settings'
``[kinds."<kind>"]``, so a deployment tunes a kind to its devices without a new build).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points as installed_entry_points
from typing import Any

from jobs.core.errors import ConfigError, UnknownKind
from jobs.core.packing import Packing
from jobs.core.policy import MAX_TIMEOUT_S
from jobs.execution.handlers import EchoHandler, Handler, SleepHandler, invalid_payload
from jobs.process.settings import KindSettings

HANDLERS_ENV = "TIERQ_HANDLERS"
ENTRY_POINT_GROUP = "tierq.handlers"

logger = logging.getLogger("tierq.worker")


class HandlerRegistry:
    """Handlers by kind. Built once per process (``default_registry``), then read-only."""

    def __init__(self, handlers: Iterable[Handler] = ()) -> None:
        self._handlers: dict[str, Handler] = {}
        self._kind_settings: dict[str, KindSettings] = {}  # ``configure_packing``
        # Each kind's packing, worked out once (asked at every start of a job of the kind).
        self._packings: dict[str, Packing | None] = {}
        for handler in handlers:
            self.register(handler)
        self._setup_lock = threading.Lock()
        self._ready: set[str] = set()  # kinds set up in the process ``_ready_in``
        self._ready_in = os.getpid()

    def setup(self, kinds: Iterable[str] | None = None) -> dict[str, float]:
        """Run the ``setup()`` (load a model, warm a device) of each handler, or of those of
        ``kinds``, not yet set up in this process: seconds each took, by kind. A worker does
        it before it takes a job (``worker_setup = "eager"``). A setup that fails raises
        ``ConfigError`` naming the kind: a worker that cannot load a model stops at start."""
        with self._setup_lock:
            if self._ready_in != os.getpid():  # a forked child sets itself up anew
                self._ready, self._ready_in = set(), os.getpid()
            took: dict[str, float] = {}
            for kind in sorted(self._handlers if kinds is None else kinds):
                handler = self._handlers.get(kind)
                if handler is None or kind in self._ready:
                    continue
                setup = getattr(handler, "setup", None)
                if callable(setup):
                    began = time.monotonic()
                    try:
                        setup()
                    except Exception as exc:
                        raise ConfigError(f"the handler of kind {kind!r} failed its setup: "
                                          f"{type(exc).__name__}: {exc}") from exc
                    took[kind] = round(time.monotonic() - began, 3)
                    logger.info("worker.handler_ready", extra={
                        "event": "worker.handler_ready", "kind": kind,
                        "duration_s": took[kind]})
                self._ready.add(kind)
            return took

    def ready(self, kind: str) -> None:
        """Set ``kind``'s handler up in this process unless it is (before a job of it runs:
        a lazy worker's first, or a no-op once the worker set every handler up)."""
        if kind not in self._ready or self._ready_in != os.getpid():
            self.setup([kind])

    def register(self, handler: Handler, *, replace: bool = False) -> None:
        if not replace and handler.kind in self._handlers:
            raise ValueError(f"a handler for kind {handler.kind!r} is already registered")
        kind_packing(handler)  # a packing it declares wrongly stops the process here, not mid-run
        self._handlers[handler.kind] = handler
        self._packings.pop(handler.kind, None)

    def configure_packing(self, kinds: Mapping[str, KindSettings]) -> None:
        """Take the deployment's ``[kinds."<kind>"]`` over the handlers' own packing. A kind
        this process has no handler of is kept quietly (the configuration is the fleet's,
        and a worker runs its pool's kinds); asking a handler without ``run_many`` to pack,
        or one without ``cost`` for a budget, is ignored with a warning."""
        self._kind_settings = dict(kinds)
        self._packings.clear()
        for kind, spec in sorted(kinds.items()):
            handler = self._handlers.get(kind)
            if handler is None:
                continue
            if (spec.max_items_per_run or 0) >= 2 and not callable(
                    getattr(handler, "run_many", None)):
                _ignored(kind, "max_items_per_run", "its handler has no run_many()")
            if spec.max_cost_per_run is not None and not callable(getattr(handler, "cost", None)):
                _ignored(kind, "max_cost_per_run", "its handler has no cost(payload)")

    def packing(self, kind: str) -> Packing | None:
        """How many items of ``kind`` (and how much of its handler's cost) one run may hold;
        None when the kind does not pack here: its handler has no ``run_many``, or fewer
        than 2 items per run (its own, or the configuration's), or it is unknown here."""
        if kind in self._packings:
            return self._packings[kind]
        handler = self._handlers.get(kind)
        if handler is None:
            return None
        found = self._packings[kind] = kind_packing(handler, self._kind_settings.get(kind))
        return found

    def get(self, kind: str) -> Handler:
        try:
            return self._handlers[kind]
        except KeyError:
            known = ", ".join(self.kinds()) or "none"
            extra = EXTRA_KINDS.get(kind)
            hint = "" if extra is None else (
                f"; it comes with the {extra} extra: pip install 'tierq[{extra}]' where the "
                "API and the workers run")
            msg = f"unknown job kind {kind!r} (known: {known}){hint}"
            raise UnknownKind(msg, details=[{"loc": ["kind"], "msg": msg}]) from None

    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def runs(self, kind: str) -> bool:
        """Whether this process has a handler for ``kind``: a job of a kind it has none for
        goes back to the queue unrun, uncharged (``jobs.execution.unstarted``)."""
        return kind in self._handlers

    def timeout_s(self, kind: str) -> float | None:
        """The kind's own run-time limit (its handler's ``timeout_s``), None when it names
        none or the kind is unknown here."""
        handler = self._handlers.get(kind)
        return None if handler is None else kind_timeout_s(handler)

    def retries_timeout(self, kind: str) -> bool:
        """Whether an attempt of this kind that ran past its limit is tried again (while
        starts remain): its handler's ``retry_on_timeout``, False by default."""
        return bool(getattr(self._handlers.get(kind), "retry_on_timeout", False))

    def validate(self, kind: str, payload: Any) -> dict[str, Any]:
        handler = self.get(kind)
        if not isinstance(payload, dict):
            msg = "the payload must be a JSON object"
            raise invalid_payload([{"loc": ["payload"], "msg": msg}])
        return handler.validate(payload)


def kind_timeout_s(handler: Handler) -> float | None:
    """A handler's ``timeout_s`` attribute, checked: a number in (0, a day], or None."""
    value = getattr(handler, "timeout_s", None)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 < value <= MAX_TIMEOUT_S):
        raise ConfigError(f"the handler of kind {handler.kind!r} has timeout_s = {value!r}: "
                          f"a number of seconds in (0, {MAX_TIMEOUT_S:g}] or None")
    return float(value)


def kind_packing(handler: Handler, override: KindSettings | None = None) -> Packing | None:
    """``handler``'s packing with ``override``'s fields over its own; None unless it has
    ``run_many`` and 2 or more items per run. ``ConfigError`` for a declaration that cannot
    work: a count that is not a whole number of at least 1, packing without ``run_many``, a
    budget without ``cost``."""
    own_items = _declared_count(handler, "max_items_per_run")
    own_cost = _declared_count(handler, "max_cost_per_run")
    run_many = callable(getattr(handler, "run_many", None))
    cost = getattr(handler, "cost", None)
    if (own_items or 0) >= 2 and not run_many:
        raise ConfigError(f"the handler of kind {handler.kind!r} has max_items_per_run = "
                          f"{own_items} but no run_many(contexts, payloads)")
    if own_cost is not None and not callable(cost):
        raise ConfigError(f"the handler of kind {handler.kind!r} has max_cost_per_run = "
                          f"{own_cost} but no cost(payload)")
    spec = override or KindSettings()
    max_items = spec.max_items_per_run or own_items
    if not run_many or max_items is None or max_items < 2:
        return None
    if not callable(cost):
        return Packing(max_items=max_items)
    return Packing(max_items=max_items, max_cost=spec.max_cost_per_run or own_cost, cost=cost)


def _declared_count(handler: Handler, name: str) -> int | None:
    value = getattr(handler, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"the handler of kind {handler.kind!r} has {name} = {value!r}: "
                          "a whole number of at least 1, or None")
    return value


def _ignored(kind: str, field: str, why: str) -> None:
    logger.warning("worker.kind_setting_ignored", extra={
        "event": "worker.kind_setting_ignored", "kind": kind, "field": field, "reason": why})


def builtin_handlers() -> list[Handler]:
    return [SleepHandler(), EchoHandler()]


# Kinds a tierq extra brings (``workers.model_handlers``): an unknown one says what to install.
EXTRA_KINDS = {"document.embed": "models", "eval.similarity": "models"}


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
    try:
        kind_timeout_s(handler)
        kind_packing(handler)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return handler
