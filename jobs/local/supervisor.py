"""The process supervisor of ``tierq up`` (``jobs.local.up``): child processes kept running.

``Supervisor`` starts children, restarts one that dies (1 s backoff doubling to 30 s, reset
after 60 s of good running) and stops them all: SIGTERM to each child's process group, a
grace period, then SIGKILL. Children stop in phases (the embedded Redis last, so the others
can finish their last writes). Each child runs in its own process group, so a Ctrl-C at the
terminal reaches only the supervisor, which then stops the children in order; on Linux each
child also gets ``PR_SET_PDEATHSIG``, so none outlives a supervisor that is killed outright.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, kw_only=True)
class ChildSpec:
    """One supervised command."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    # Lower phases stop first; children of one phase stop together.
    stop_phase: int = 0
    # Sent by the kernel if the supervisor dies without stopping it (Linux).
    death_signal: int = signal.SIGKILL


@dataclass(frozen=True, kw_only=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 30.0
    # A child that ran this long before dying starts again from ``initial_s``.
    reset_after_s: float = 60.0

    def delay_s(self, failures: int) -> float:
        return min(self.max_s, self.initial_s * 2.0 ** max(0, failures - 1))


@dataclass(frozen=True, kw_only=True)
class RunStats:
    exited: tuple[str, ...] = ()
    started: tuple[str, ...] = ()


@dataclass
class _Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None


def _log(level: int, event: str, **fields: Any) -> None:
    logger.log(level, event, extra={"event": event, **fields})


def _death_signal_hook(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to send ``sig`` when the parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


class Supervisor:
    """Starts, watches, restarts and stops child processes; driven by ``run_once``."""

    def __init__(
        self,
        *,
        backoff: Backoff | None = None,
        grace_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff = backoff or Backoff()
        self.grace_s = grace_s
        self.clock = clock
        self._children: list[_Child] = []
        self._stopping = False

    def add(self, spec: ChildSpec) -> int:
        """Start ``spec`` now and supervise it; returns its pid."""
        child = _Child(spec=spec)
        self._children.append(child)
        self._start(child, self.clock())
        assert child.process is not None
        return child.process.pid

    def _start(self, child: _Child, now: float) -> None:
        spec = child.spec
        child.process = subprocess.Popen(
            list(spec.argv),
            env=dict(spec.env) if spec.env is not None else None,
            process_group=0,
            preexec_fn=_death_signal_hook(spec.death_signal),
        )
        child.started_at = now
        child.restart_at = None
        _log(logging.INFO, "child.started", child=spec.name, pid=child.process.pid)

    def pid(self, name: str) -> int | None:
        for child in self._children:
            if child.spec.name == name and child.process is not None:
                return child.process.pid
        return None

    def pids(self) -> dict[str, int]:
        return {c.spec.name: c.process.pid for c in self._children if c.process is not None}

    def alive(self, name: str) -> bool:
        return any(
            c.spec.name == name and c.process is not None and c.process.poll() is None
            for c in self._children
        )

    def run_once(self, now: float | None = None) -> RunStats:
        """Reap children that died (scheduling their restart) and start those that are due."""
        now = self.clock() if now is None else now
        exited: list[str] = []
        started: list[str] = []
        for child in self._children:
            if child.process is not None and child.process.poll() is not None:
                self._schedule_restart(child, now)
                exited.append(child.spec.name)
            due = child.restart_at is not None and now >= child.restart_at
            if child.process is None and due and not self._stopping:
                try:
                    self._start(child, now)
                    started.append(child.spec.name)
                except OSError as exc:
                    _log(logging.ERROR, "child.start_failed", child=child.spec.name, error=str(exc))
                    child.started_at = now
                    self._schedule_restart(child, now)
        return RunStats(exited=tuple(exited), started=tuple(started))

    def _schedule_restart(self, child: _Child, now: float) -> None:
        returncode = child.process.returncode if child.process is not None else None
        if now - child.started_at >= self.backoff.reset_after_s:
            child.failures = 0
        child.failures += 1
        delay = self.backoff.delay_s(child.failures)
        child.process = None
        child.restart_at = now + delay
        _log(
            logging.WARNING,
            "child.exited",
            child=child.spec.name,
            returncode=returncode,
            restart_in_s=delay,
        )

    def run_until(self, stop: threading.Event, *, period_s: float = 0.5) -> None:
        while not stop.is_set():
            self.run_once()
            stop.wait(period_s)

    def stop(self, grace_s: float | None = None) -> dict[str, int | None]:
        """Stop every child, phase by phase: SIGTERM, up to ``grace_s``, then SIGKILL.
        Returns each stopped child's exit status (negative: the signal that ended it)."""
        self._stopping = True
        grace = self.grace_s if grace_s is None else grace_s
        codes: dict[str, int | None] = {}
        for phase in sorted({c.spec.stop_phase for c in self._children}):
            group = [c for c in self._children if c.spec.stop_phase == phase]
            codes.update(self._stop_group(group, grace))
        return codes

    def _stop_group(self, group: list[_Child], grace_s: float) -> dict[str, int | None]:
        running = [c.process for c in group if c.process is not None]
        for process in running:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _log(logging.WARNING, "child.killed", pid=process.pid, grace_s=grace_s)
                _signal_group(process, signal.SIGKILL)
                process.wait()
        codes: dict[str, int | None] = {}
        for child in group:
            if child.process is not None:
                codes[child.spec.name] = child.process.returncode
                _log(logging.INFO, "child.stopped", child=child.spec.name,
                     returncode=child.process.returncode)
            child.process = None
            child.restart_at = None
        return codes


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the child's whole process group while the child is not yet reaped (its pid,
    and so its group id, cannot have been reused)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
