"""Run-time limits: a handler past its limit is asked to stop; one that does not stop is
ended with the process running it.

An attempt may run ``timeout_s`` (the job's, resolved at submit from the job, its kind or
the policy). At the limit the heartbeat asks the handler to stop, as a cancel asks
(``JobContext.mark_timed_out``); ``policy.timeout_grace_s`` later it renews the lease no
more and calls the attempt's ``overrun``, on a thread of its own: that records the attempt
as timed out, then ends this process (``end_process``), since no thread can be stopped from
outside and a hung CUDA call or a deadlock never returns. A prefork child simply exits, and
its pool starts another; a worker on the thread pool stops as if told to (its other jobs
finish or are handed back within the stop grace), then exits for its supervisor to start it
again (``workers.stopping``). Were nothing in the process able to run, the lease, no longer
renewed, lapses and the reaper ends the attempt (``jobs.dispatch.recovery``).

Ending a handler ends everything it started: a CUDA binary or an ffmpeg it runs would
otherwise outlive it, holding the device while the slot takes the next job. Before the
process exits, ``end_started`` ends every process it started and each of theirs, found by
descent (``psutil``), not by process group: the worker may share its group with its
supervisor (``tierq worker`` in a shell), and a handler's child may lead a session of its
own. A process that left the tree (a daemon's double fork, re-parented to init) is out of
reach; the worker does not adopt orphans (``PR_SET_CHILD_SUBREAPER``), since it could not
reap them without taking the exit status a handler waits for. Nothing outside the tree
(the worker's parent, a supervisor) is ever signalled.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import psutil

from jobs.core.domain import Job
from jobs.core.policy import Policy

logger = logging.getLogger("tierq.worker")

# The exit status of a process ended for a handler that would not stop (EX_SOFTWARE).
EXIT_OVERRUN = 70
# What a handler started has this long after SIGTERM to end before it is killed.
TERM_WAIT_S = 1.0


def limit_s(job: Job, policy: Policy, kind_s: float | None = None) -> float:
    """The attempt's run-time limit: the job's own (resolved at submit), else (a row from
    before limits) its kind's ``kind_s``, else the policy's default."""
    if job.timeout_s is not None:
        return job.timeout_s
    return kind_s if kind_s is not None else policy.default_timeout_s


def timed_out_error(limit: float) -> str:
    """The ``error`` of an attempt that ran past its limit."""
    return f"timed out: still running after its run-time limit of {limit:g} s (timeout_s)"


def end_started(term_wait_s: float = TERM_WAIT_S) -> int:
    """End every process this one started, and each of theirs: SIGTERM, then SIGKILL to any
    still alive ``term_wait_s`` later and to any started meanwhile. Returns how many there
    were. The tree is read before any is signalled: a parent that ends first leaves its
    children to init, out of reach of a later reading. Zombies are left to their parents
    (this process's own children to the ``Popen`` that waits for each)."""
    started = _descendants()
    if not started:
        return 0
    logger.warning("worker.ending_started", extra={
        "event": "worker.ending_started", "pids": [process.pid for process in started]})
    _signal(started, signal.SIGTERM)
    deadline = time.monotonic() + term_wait_s
    left = [process for process in started if _alive(process)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [process for process in left if _alive(process)]
    left += [process for process in _descendants() if process not in left]
    _signal(left, signal.SIGKILL)
    return len(started)


def _descendants() -> list[psutil.Process]:
    try:
        return list(psutil.Process().children(recursive=True))
    except psutil.Error:
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _signal(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        try:
            process.send_signal(sig)  # refused for a pid reused since it was read
        except psutil.Error:
            pass


def exit_now(grace_s: float) -> None:
    """End this process at once (a prefork child: its pool starts another), and everything
    it started with it."""
    logger.error("worker.ending_process", extra={
        "event": "worker.ending_process", "reason": "a handler did not stop at its limit"})
    end_started()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_OVERRUN)


EndsProcess = Callable[[float], None]
_END: list[EndsProcess] = [exit_now]
_ENDING = threading.Event()


def set_process_end(action: EndsProcess) -> None:
    """How this process ends after an overrun (``workers.main``: the thread pool's way)."""
    _END[0] = action


def end_process(grace_s: float) -> None:
    """End this process, once, by the action set for it; ``grace_s`` is what its other
    running jobs may take to finish or be handed back."""
    if _ENDING.is_set():
        return
    _ENDING.set()
    _END[0](grace_s)


def ending() -> bool:
    """This process is being ended for an overrun: a slot it frees takes no next job."""
    return _ENDING.is_set()
