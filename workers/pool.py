"""Celery's thread pool, waking the worker's event loop as each task ends.

The worker takes a message only when a slot is free (``worker_disable_prefetch``: a busy
worker must not hold messages whose leases run out while they wait). Celery checks that
gate when its event loop wakes, and a task ending in a pool thread does not wake it: with
task events off (the default, ``workers.app``) nothing else does, so a full worker
picked up its next message only at the loop's one-second timeout. Waking the loop
(``Hub.call_soon`` is thread-safe) once the task has ended and freed its slot makes the next
message start at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.concurrency import thread
from kombu.asynchronous import get_event_loop


def _noop() -> None:
    """Scheduled only to wake the loop: its next turn sees the freed slot."""


def _then_wake(callback: Callable[..., Any]) -> Callable[..., Any]:
    def done(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)  # the request's end: its slot is free after this
        finally:
            hub = get_event_loop()
            if hub is not None:
                hub.call_soon(_noop)  # type: ignore[no-untyped-call]

    return done


class TaskPool(thread.TaskPool):  # type: ignore[misc]
    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **rest: Any,
    ) -> Any:
        if callback is not None:
            callback = _then_wake(callback)
        return super().on_apply(target, args, kwargs, callback, accept_callback, **rest)
