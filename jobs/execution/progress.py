"""A running job's progress reports on their way to Redis, throttled.

A handler may report per item (thousands a second); Redis gets the first report at once,
then at most one every ``REPORT_EVERY_S``: a report that comes sooner waits, replaced by any
later one, and a timer sends whichever is latest when its turn comes. ``close`` (the handler
returned) sends what is still waiting, so the last report is never lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from jobs.core.progress import REPORT_EVERY_S, Report
from jobs.index import progress as progress_index
from jobs.process.runtime import Runtime


class ProgressSender:
    """The ``reporter`` of one attempt's ``JobContext``."""

    def __init__(self, runtime: Runtime, job_id: str, *, every_s: float = REPORT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._runtime = runtime
        self._job_id = job_id
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: Report | None = None
        self._sent_at = -float("inf")
        self._timer: threading.Timer | None = None
        self.sent = 0

    def __call__(self, report: Report) -> None:
        with self._lock:
            self._pending = report
            wait = self._sent_at + self._every_s - self._clock()
            if wait <= 0:
                self._send_locked()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        with self._lock:
            self._timer = None
            self._send_locked()

    def close(self) -> None:
        """Send the report still waiting, if any; no timer outlives the attempt."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._send_locked()

    def _send_locked(self) -> None:
        report, self._pending = self._pending, None
        if report is None:
            return
        self._sent_at = self._clock()
        runtime = self._runtime
        if progress_index.write(runtime.redis, runtime.prefix, self._job_id, report):
            self.sent += 1
