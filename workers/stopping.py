"""Stop grace: a worker told to stop hands back, uncharged, the jobs it cannot finish in time.

Whoever stops a worker (``tierq up``, compose, Kubernetes) sends SIGTERM, waits
``policy.stop_grace_s``, then kills it. Celery's warm shutdown lets running jobs finish;
those still running ``handback_after_s(grace)`` after the signal are asked to stop, as a
cancel asks, and go back to the queue as a new attempt, not charged one
(``jobs.execution.running.hand_back_running``). Killed instead, they would wait a lease TTL for
the reaper and be charged the attempt. A handler that has not stopped halfway from then to the
grace's end will be killed with its worker: what it started (a CUDA binary, an ffmpeg) is
ended then, by the worker itself (``jobs.execution.limits.end_started``), since the kill
reaches the worker's process group at best and the handler's child may have left it.

The thread pool runs jobs in the worker process, which Celery tells of the stop
(``worker_shutting_down``). A prefork child runs them in its own process: it keeps SIGTERM
for itself (Celery resets it to "die at once" in children) and the parent forwards its stop
to the children, so the same timer starts there, whether the signal reached the whole
process group (``tierq up``) or only the parent (``docker stop``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from celery import signals

from jobs.core.policy import handback_after_s
from jobs.execution import limits
from jobs.execution.running import RUNNING, hand_back_running
from jobs.process.settings import Settings

logger = logging.getLogger("tierq.worker")


class _HandBack:
    """Starts the hand-back timer once per process, on the first stop signal; past the
    hand-back, ``end_after_s`` after the signal, ends what handlers still running started."""

    def __init__(self, after_s: float, end_after_s: float) -> None:
        self.after_s = after_s
        self.end_after_s = max(after_s, end_after_s)
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._pid = os.getpid()

    def start(self) -> None:
        with self._lock:
            if self._timer is not None and self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._timer = threading.Timer(self.after_s, self._fire)
            self._timer.daemon = True
            self._timer.start()
        logger.info("worker.stopping", extra={
            "event": "worker.stopping", "handback_after_s": self.after_s})

    def started(self) -> bool:
        """This process was told to stop."""
        with self._lock:
            return self._timer is not None and self._pid == os.getpid()

    def _fire(self) -> None:
        count = hand_back_running()
        if count:
            logger.warning("worker.handing_back", extra={
                "event": "worker.handing_back", "jobs": count, "after_s": self.after_s})
            timer = threading.Timer(self.end_after_s - self.after_s, _end_what_hangs)
            timer.daemon = True
            timer.start()


def _end_what_hangs() -> None:
    """Handlers asked to stop and still running will be killed with the worker at the
    grace's end: what they started ends now, so that it does not outlive them."""
    if RUNNING.count():
        limits.end_started()


def ends_started_after_s(stop_grace_s: float) -> float:
    """Seconds after a stop signal at which a worker ends what its handlers still running
    started: halfway between the hand-back and the grace's end (the kill)."""
    after = handback_after_s(stop_grace_s)
    return after + (stop_grace_s - after) / 2.0


_INSTALLED: list[_HandBack] = []


def stop_requested() -> bool:
    """This worker process is stopping, or ending for a handler past its limit: a slot it
    frees takes no next job (``workers.tasks``), which would only wait in the worker's own
    queue."""
    return limits.ending() or (bool(_INSTALLED) and _INSTALLED[-1].started())


def end_worker_process(grace_s: float) -> None:
    """How a worker on the thread pool ends after a handler would not stop at its limit
    (``jobs.execution.limits``): it stops as if told to (it takes no new message; its other
    jobs finish, or are handed back near the end of ``grace_s``), then exits, the hung thread
    with it, for its supervisor to start it again (``tierq up`` does, as compose's or
    Kubernetes' restart policy would)."""
    logger.error("worker.ending_for_overrun", extra={
        "event": "worker.ending_for_overrun", "grace_s": grace_s})
    os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown, and the hand-back timer
    deadline = time.monotonic() + grace_s
    while RUNNING.count() > 1 and time.monotonic() < deadline:  # the hung one never leaves
        time.sleep(0.1)
    limits.exit_now(grace_s)


def install(settings: Settings) -> None:
    """Connect the hand-back to this worker's stop (call once, before the worker starts)."""
    grace = settings.policy.stop_grace_s
    handback = _HandBack(handback_after_s(grace), ends_started_after_s(grace))
    _INSTALLED.append(handback)

    def on_shutting_down(**_: Any) -> None:
        handback.start()
        _forward_to_children()

    parent = os.getpid()
    armed: set[int] = set()

    def on_task(**_: Any) -> None:
        # billiard sets its own SIGTERM handler in a prefork child after every init hook;
        # the first task in the child takes it over.
        pid = os.getpid()
        if pid != parent and pid not in armed:
            armed.add(pid)
            signal.signal(signal.SIGTERM, _ChildTerm(handback))

    signals.worker_shutting_down.connect(on_shutting_down, weak=False)
    signals.task_prerun.connect(on_task, weak=False)


class _ChildTerm:
    """SIGTERM in a prefork child: the first starts the hand-back; it may come twice at once
    (to the process group, and forwarded by the parent). One later than that is a terminate
    (Celery's cold shutdown): the child ends as SIGTERM would have ended it."""

    ECHO_S = 2.0

    def __init__(self, handback: _HandBack) -> None:
        self.handback = handback
        self.first: float | None = None

    def __call__(self, signum: int, frame: object) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
            self.handback.start()
        elif now - self.first > self.ECHO_S:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)


def _forward_to_children() -> None:
    """Tell prefork children (there are none with the thread pool) that the worker stops."""
    from billiard import process  # type: ignore[import-untyped]

    for child in process.active_children():
        pid = child.pid
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
