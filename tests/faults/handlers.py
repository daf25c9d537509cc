"""A handler that leaves a trace of every run in a file, across worker processes.

``tracked`` appends ``start`` when a run begins, ``done`` when its handler returns, and
``stop`` when it ends any other way (lease lost, cancelled): one line each, ``O_APPEND``, so
lines from concurrent processes never interleave, in the file named by ``RUN_LOG_ENV``. A
run with a ``start`` and no end line was killed with its process. A test reads the file back
to count runs: a job that succeeded must have exactly one ``done`` line (a finished result
was never thrown away and computed again), and its attempt must be the one SQL recorded;
per tenant, the runs open at once show whether a cap was overshot.

Each line carries the true time (``CLOCK_REALTIME``, which a clock-skewed test process does
not shift: see ``tests/faults/skew``) and the process's own view of it (``time.time()``),
so runs of processes with skewed clocks still line up, and the skew shows.

Load it with ``TIERQ_HANDLERS=tests.faults.handlers:HANDLERS``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.handlers import Handler, JobCancelled, JobContext, check_run

RUN_LOG_ENV = "FAULTS_RUN_LOG"


class TrackedHandler:
    """Sleeps ``payload["seconds"]`` (default 0) through ``ctx.sleep``, writing its trace."""

    kind = "tracked"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return dict(payload)

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        _write("start", ctx)
        try:
            if not ctx.sleep(float(payload.get("seconds", 0))):
                ctx.check()  # lease lost or cancelled: stop without a "done"
            if payload.get("nul"):
                # An error PostgreSQL cannot store as it is: the attempt still ends once.
                raise ValueError("bad byte \x00 in the input")
        except BaseException:
            _write("stop", ctx)
            raise
        _write("done", ctx)
        return {"attempt": ctx.attempt, "pid": os.getpid()}


class TrackedGpuHandler(TrackedHandler):
    """``tracked`` under a kind of the soak's second pool (``gpu``), which packs: up to
    ``max_items_per_run`` of its jobs share one handler call (``run_many``). Every item's run
    is traced as ``tracked``'s, its ``start`` lines all written at one instant (the run's
    start, so the checker counts a tenant's items of one run as the one slot they hold), and
    its tenants' caps are that pool's."""

    kind = "tracked.gpu"
    max_items_per_run = 6

    def run_many(self, contexts: list[JobContext], payloads: list[dict[str, Any]]) -> list[Any]:
        at, seen = true_time(), time.time()
        for ctx in contexts:
            _write("start", ctx, at=at, seen=seen)
        try:
            until = time.monotonic() + max(float(p.get("seconds", 0)) for p in payloads)
            while time.monotonic() < until:
                check_run(contexts)  # a run-level stop ends every item without a "done"
                time.sleep(min(0.02, max(0.0, until - time.monotonic())))
            wanted = set(check_run(contexts))
        except BaseException:
            for ctx in contexts:
                _write("stop", ctx)
            raise
        outcomes: list[Any] = []
        for i, (ctx, payload) in enumerate(zip(contexts, payloads, strict=True)):
            if i not in wanted:
                _write("stop", ctx)
                outcomes.append(JobCancelled(f"job {ctx.job_id} was cancelled"))
            elif payload.get("nul"):
                _write("stop", ctx)
                outcomes.append(ValueError("bad byte \x00 in the input"))
            else:
                _write("done", ctx)
                outcomes.append({"attempt": ctx.attempt, "pid": os.getpid()})
        return outcomes


# The kinds whose runs leave a trace.
TRACKED_KINDS = (TrackedHandler.kind, TrackedGpuHandler.kind)


class NulResultHandler:
    """Returns a result holding U+0000, which PostgreSQL cannot store: the job ends failed
    with the reason, once, and is never run again."""

    kind = "nul-result"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return dict(payload)

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        return {"text": "page one\x00page two", "attempt": ctx.attempt}


class HungHandler:
    """Ignores every stop, as a CUDA call that never returns would: only its run-time limit
    ends it, with the process running it. With ``payload["child_pid_file"]`` it first starts
    a child (``sleep``, in a session of its own, as a binary it runs) and writes its pid
    there: the child must end with it. Leaves no trace: it is no load's job."""

    kind = "hung"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return dict(payload)

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        pid_file = payload.get("child_pid_file")
        if pid_file is not None:
            child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
            Path(pid_file).write_text(str(child.pid))
        while True:
            time.sleep(3600)


def true_time() -> float:
    """The wall clock, unshifted even in a clock-skewed test process."""
    return time.clock_gettime(time.CLOCK_REALTIME)


def _write(what: str, ctx: JobContext, *, at: float | None = None,
           seen: float | None = None) -> None:
    path = os.environ[RUN_LOG_ENV]
    at = true_time() if at is None else at
    seen = time.time() if seen is None else seen
    line = f"{what} {ctx.job_id} {ctx.attempt} {os.getpid()} {at:.6f} {seen:.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@dataclass(frozen=True, kw_only=True)
class Run:
    what: str  # start, done or stop
    job_id: str
    attempt: int
    pid: int
    at: float  # true time
    seen: float  # the process's time.time() at that moment

    @property
    def skew_s(self) -> float:
        return self.seen - self.at


def read_runs(path: Path) -> dict[str, list[Run]]:
    """The trace by job id, in the order it was written."""
    runs: dict[str, list[Run]] = defaultdict(list)
    if not path.exists():
        return runs
    for line in path.read_text().splitlines():
        what, job_id, attempt, pid, at, seen = line.split()
        runs[job_id].append(Run(
            what=what, job_id=job_id, attempt=int(attempt), pid=int(pid), at=float(at),
            seen=float(seen),
        ))
    return runs


HANDLERS: list[Handler] = [TrackedHandler(), TrackedGpuHandler(), NulResultHandler(), HungHandler()]
