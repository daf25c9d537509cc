"""One thread per worker process renews the leases of all its running jobs.

A thread per job would cost a thread's start and join on every job, on the path between one
job's end and the next one's start. Here each running job's ``Heartbeat`` is a schedule entry
instead: the renewer wakes when the next one is due (or a new one must renew at once: a
start's announcement), renews it, and schedules it again. ``remove`` waits out a renewal in
progress, so no renewal follows it: a heartbeat stopped before its lease's release never
renews the released lease. Renewals run one after another; a Redis that hangs delays the
others by at most its socket timeout, well within a lease's TTL. Built per process on first
use (a forked child builds its own).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from typing import Protocol

logger = logging.getLogger("tierq.worker")


class Renews(Protocol):
    """What the renewer schedules: a ``Heartbeat``."""

    renew_every_s: float

    def due_in(self) -> float:
        """Seconds until its next tick (at most ``renew_every_s``)."""
        ...

    def tick(self) -> None:
        """One renewal (the first may announce the start); never raises."""


class Renewer:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, Renews]] = []  # (when, order, heartbeat)
        self._live: set[int] = set()  # ids of the heartbeats scheduled
        self._busy: Renews | None = None  # the one being renewed now
        self._order = itertools.count()
        self._pid = 0
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def add(self, heartbeat: Renews, *, now: bool) -> None:
        """Schedule ``heartbeat``: its first renewal at once (``now``) or after its period."""
        at = time.monotonic() + (0.0 if now else heartbeat.due_in())
        if self._pid != os.getpid():
            self._start()
        with self._lock:
            self._live.add(id(heartbeat))
            sooner = not self._due or at < self._due[0][0]
            heapq.heappush(self._due, (at, next(self._order), heartbeat))
            if sooner:  # else the renewer wakes in time for it anyway: no wake-up to pay
                self._lock.notify()

    def remove(self, heartbeat: Renews) -> None:
        """No renewal of ``heartbeat`` from now on (one in progress is waited for). Its entry
        leaves the schedule now, not when it would have come due: an ended job's heartbeat
        (its context, events and locks) is freed at its end, and does not live on for a
        renewal period, long enough to reach the garbage collector's oldest generation
        (whose full passes, job after job, would stall every slot of the worker)."""
        with self._lock:
            self._live.discard(id(heartbeat))
            kept = [entry for entry in self._due if entry[2] is not heartbeat]
            if len(kept) != len(self._due):  # a few entries: one per running job
                heapq.heapify(kept)
                self._due = kept
            while self._busy is heartbeat:
                self._lock.wait()

    def _start(self) -> None:
        """This process's thread (a forked child's own: the parent's is not in it)."""
        with self._start_lock:
            if self._pid == os.getpid():
                return
            self._lock = threading.Condition()
            self._due, self._live, self._busy = [], set(), None
            self._thread = threading.Thread(target=self._run, name="lease-renewer",
                                            daemon=True)
            self._thread.start()
            self._pid = os.getpid()

    def _next(self) -> Renews:
        """Wait for the next heartbeat due and mark it busy."""
        with self._lock:
            while True:
                if self._due:
                    wait = self._due[0][0] - time.monotonic()
                    if wait <= 0:
                        heartbeat = heapq.heappop(self._due)[2]
                        self._busy = heartbeat
                        return heartbeat
                    self._lock.wait(wait)
                else:
                    self._lock.wait()

    def _run(self) -> None:
        while True:
            heartbeat = self._next()
            try:
                heartbeat.tick()
            except Exception:  # the renewer must outlive any one failed renewal
                logger.exception("job.heartbeat_error", extra={"event": "job.heartbeat_error"})
            with self._lock:
                self._busy = None
                if id(heartbeat) in self._live:
                    at = time.monotonic() + heartbeat.due_in()
                    heapq.heappush(self._due, (at, next(self._order), heartbeat))
                self._lock.notify_all()


RENEWER = Renewer()
