"""Handlers used only by tests: each makes one way a job can end easy to provoke.

Load them into a worker with ``TIERQ_HANDLERS=tests.handlers_for_tests:HANDLERS`` (the
process must run from the repository root), or register instances in a registry directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import redis

from workers.handlers import Handler, JobCancelled, JobContext, RetryableError, check_run


class _AnyObject:
    """Accepts any JSON object as its payload."""

    kind = ""

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return dict(payload)


class RecordingHandler(_AnyObject):
    """Records every call; returns the attempt it ran."""

    kind = "record"

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        with self._lock:
            self.calls.append((ctx.job_id, ctx.attempt, payload))
        return {"attempt": ctx.attempt}


class FlakyHandler(RecordingHandler):
    """Raises ``RetryableError`` until ``payload["succeed_on"]`` (default: never)."""

    kind = "flaky"

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        super().run(ctx, payload)
        succeed_on = payload.get("succeed_on")
        if succeed_on is None or ctx.attempt < succeed_on:
            raise RetryableError(f"not yet (attempt {ctx.attempt})")
        return {"attempt": ctx.attempt}


class BlockingHandler(_AnyObject):
    """Runs until the job must stop (cancel or lost lease), then returns normally, or
    raises ``RetryableError`` when the payload says ``{"then": "retry"}``."""

    kind = "block"

    def __init__(self) -> None:
        self.started = threading.Event()

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        self.started.set()
        while ctx.sleep(60):
            pass
        if payload.get("then") == "retry":
            raise RetryableError("interrupted")
        return {"stopped": True}


class GateHandler(_AnyObject):
    """Ignores its context: waits for ``gate`` (set by the test), then returns a result."""

    kind = "gate"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.gate = threading.Event()

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        self.started.set()
        if not self.gate.wait(60):
            raise TimeoutError("the test never opened the gate")
        return {"late": True}


class UnserialisableHandler(_AnyObject):
    """Returns something JSON cannot hold."""

    kind = "unserialisable"

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        return {"values": {1, 2, 3}}


class CrashHandler(_AnyObject):
    """Kills its own worker process (SIGKILL): the lease must recover the job."""

    kind = "crash"

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)
        return None


class HangHandler(_AnyObject):
    """Ignores every stop, as a CUDA call that never returns would: only ending the process
    running it ends it. With ``payload["child_pid_file"]`` it first starts a child process
    (``sleep``, in a session of its own, out of reach of a kill of the worker's process
    group) and writes its pid there: a binary the handler runs, which must end with it."""

    kind = "hang"

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        pid_file = payload.get("child_pid_file")
        if pid_file is not None:
            child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
            Path(pid_file).write_text(str(child.pid))
        while True:
            time.sleep(3600)


class LimitedHandler(BlockingHandler):
    """Runs until told to stop, under a run-time limit of its kind's own (0.5 s), and asks
    for another attempt when it times out."""

    kind = "limited"
    timeout_s = 0.5
    retry_on_timeout = True


class WarmHandler(_AnyObject):
    """Sets up slowly, as loading a model does, and says in its result whether the process
    running it was set up before it ran, and how often."""

    kind = "warm"
    SETUP_S = 1.0

    def __init__(self) -> None:
        self.setups = 0
        self.set_up_in: int | None = None

    def setup(self) -> None:
        time.sleep(self.SETUP_S)
        self.setups += 1
        self.set_up_in = os.getpid()

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        return {"set_up_here": self.set_up_in == os.getpid(), "setups": self.setups}


class BrokenSetupHandler(_AnyObject):
    """Cannot set up (a model that will not load): its worker must not start."""

    kind = "broken.setup"

    def setup(self) -> None:
        raise RuntimeError("no device here")

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        return None


class NapHandler(_AnyObject):
    """Holds its slot for ``payload["seconds"]`` as ``sleep`` does, under a kind of its own:
    a second slow kind, for a pool of its own."""

    kind = "nap"

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        ctx.sleep(float(payload.get("seconds", 0)))
        return {"napped": payload.get("seconds", 0)}


class SpanHandler(_AnyObject):
    """Holds its slot ``payload["seconds"]``, then pushes ``"<start> <end>"`` (``time.time()``)
    onto the Redis list ``payload["key"]`` of the worker's own Redis: when each handler ran."""

    kind = "span"

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        started = time.time()
        time.sleep(float(payload["seconds"]))
        client = redis.Redis.from_url(os.environ["TIERQ_REDIS_URL"])
        try:
            client.rpush(str(payload["key"]), f"{started!r} {time.time()!r}")
        finally:
            client.close()
        return None


class UpperHandler(_AnyObject):
    """A kind a deployment adds (``TIERQ_HANDLERS``) that not every worker may have: its text
    upper-cased, and the process that ran it."""

    kind = "text.upper"

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        return {"text": str(payload.get("text", "")).upper(), "pid": os.getpid()}


class PackHandler(_AnyObject):
    """Packs up to 16 items per run (``run_many``): holds its slot for the longest
    ``payload["seconds"]`` of its items (stopping early for a run-level stop), then pushes
    ``"<start> <end> <id>,<id>,..."`` (``time.time()``) onto the Redis list ``payload["key"]``
    of its first item: when each run ran and what it held. An item with ``"fail": true``
    ends failed alone; one with ``"poison": true`` makes the whole call raise."""

    kind = "pack"
    max_items_per_run = 16

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        outcome = self.run_many([ctx], [payload])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def run_many(self, contexts: list[JobContext], payloads: list[dict[str, Any]]) -> list[Any]:
        started = time.time()
        if any(p.get("poison") for p in payloads):
            raise RuntimeError("a poisoned item breaks the whole run")
        until = started + max(float(p.get("seconds", 0)) for p in payloads)
        while time.time() < until:
            check_run(contexts)
            contexts[0].sleep(min(0.05, max(0.0, until - time.time())))
        wanted = set(check_run(contexts))
        client = redis.Redis.from_url(os.environ["TIERQ_REDIS_URL"])
        try:
            ids = ",".join(ctx.job_id for ctx in contexts)
            client.rpush(str(payloads[0]["key"]), f"{started!r} {time.time()!r} {ids}")
        finally:
            client.close()
        return [JobCancelled("cancelled") if i not in wanted
                else ValueError("asked to fail") if p.get("fail") else {"items": len(payloads)}
                for i, p in enumerate(payloads)]


# For TIERQ_HANDLERS in worker processes.
HANDLERS: list[Handler] = [RecordingHandler(), FlakyHandler(), CrashHandler()]
# Beside them, for the tests of run-time limits.
LIMIT_HANDLERS: list[Handler] = [BlockingHandler(), HangHandler(), LimitedHandler()]
# Beside them, for the tests of handlers set up before the worker takes a job.
WARM_HANDLERS: list[Handler] = [WarmHandler()]
# For the tests of pools: a slow kind besides ``sleep``.
POOL_HANDLERS: list[Handler] = [NapHandler()]
# For the tests of a worker's slots passing on: the handler that records when it ran.
SPAN_HANDLERS: list[Handler] = [SpanHandler()]
