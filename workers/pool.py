"""Celery's thread pool, waking the worker's event loop as each task ends, with one thread
more than its slots.

The worker takes a message only when a slot is free (``worker_disable_prefetch``: a busy
worker must not hold messages whose leases run out while they wait). Celery checks that
gate when its event loop wakes, and a task ending in a pool thread does not wake it: with
task events off (the default, ``workers.app``) nothing else does, so a full worker
picked up its next message only at the loop's one-second timeout. Waking the loop
(``Hub.call_soon`` is thread-safe) once the task has ended and freed its slot makes the next
message start at once.

A slot that frees hands its next job to this worker's own consumer before its task has
returned (``workers.handover``): the task that ends is still recording its ending while the
next one is taken. With a thread per slot, that next task waited for the ending's task to
return, and everything Celery does to start it sat between one job and the next. One spare
thread lets it start at once and wait for its start, made ahead by the ending's statement
(``jobs.execution.prestart``), while that statement commits. The worker still takes no more
messages than it has slots: its gate counts reserved requests against ``limit``
(``worker_disable_prefetch``), and a handed-over task is one of them from its delivery, so
no more handlers than slots run at once; the spare thread runs the ending of a task whose
slot is already its successor's. Without that gate (a broker other than Redis, where
prefetched messages wait in the pool's queue) there is no spare thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
    executor: ThreadPoolExecutor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.app is not None and self.app.conf.worker_disable_prefetch:
            self.executor.shutdown(wait=False)
            self.executor = ThreadPoolExecutor(max_workers=self.limit + 1)

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
