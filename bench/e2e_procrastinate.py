"""procrastinate in the end-to-end bench: its database, its worker, and the side that drives it.

A durable PostgreSQL queue is the other way to build what tierq builds: every job a row, no
broker. procrastinate runs as its users run it: an App on the psycopg connector, its schema
applied to a database of its own (empty, made for this run and dropped at the end, so that
``pg_stat_database`` and the backends counted hold its work and nothing else), one worker
process with 4 concurrent slots (``bare_procrastinate.py``), and jobs deferred one per call
with ``task.defer`` from the client threads, a pool connection each. Done is the job's row
reading ``status = 'succeeded'``, read by a connection of the bench's own (counted, and left
out of the figures).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import procrastinate
import psycopg
import redis
import sqlalchemy as sa
from bare_procrastinate import HOLD, MARK, NOOP, URL_ENV, make_app
from e2e_meters import ThreadCpu
from e2e_sides import (
    IDLE_GAP_S,
    MakeCall,
    not_succeeded,
    paced,
    pop_mark,
    wait_all,
    wait_for,
)
from e2e_stack import BENCH_DIR, WORKER_SLOTS, Child, child
from start_mark import MARK_URL_ENV
from submit import Figures, hammer

FAILED = {"failed", "cancelled", "aborted"}


@contextlib.contextmanager
def empty_database(admin_url: sa.URL) -> Iterator[str]:
    """A new, empty database (a libpq conninfo URL), dropped afterwards."""
    name = f"tierq_bench_pq_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = admin_url.set(drivername="postgresql", database=name)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextlib.contextmanager
def procrastinate_worker(conninfo: str, redis_url: str, workdir: Path) -> Iterator[Child]:
    """The schema applied, then the worker (4 slots) running until the block exits."""
    schema = make_app(conninfo)
    with schema.open():
        schema.schema_manager.apply_schema()
    env = {**os.environ, URL_ENV: conninfo, MARK_URL_ENV: redis_url, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, str(BENCH_DIR / "bare_procrastinate.py"), str(WORKER_SLOTS)]
    with child("procrastinate", command, env=env, workdir=workdir) as process:
        yield process


@dataclass
class ProcrastinateSide:
    conninfo: str
    worker: Child
    marks: redis.Redis  # the bench Redis, where tasks push their start marks
    clients: int  # client threads: the client pool has a connection for each
    sql_polls: int = 0
    redis_polls: int = 0
    client_cpu: ThreadCpu = field(default_factory=ThreadCpu)
    app: procrastinate.App = field(init=False)
    _conn: psycopg.Connection[Any] = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    backend_pid: int = field(init=False)  # the PostgreSQL backend of the bench's own reads

    def __post_init__(self) -> None:
        self.app = make_app(self.conninfo, min_size=self.clients, max_size=self.clients)
        self.app.open()
        self._conn = psycopg.connect(self.conninfo, autocommit=True)
        self.backend_pid = self._conn.info.backend_pid
        wait_for("the procrastinate worker is up", self._worker_registered, 60, every=0.1)

    def close(self) -> None:
        self._conn.close()
        self.app.close()

    def _read(self, query: str, *params: Any) -> Any:
        """One value from the bench's own connection (one SQL transaction, counted)."""
        with self._lock:
            self.sql_polls += 1
            row = self._conn.execute(query, params).fetchone()  # type: ignore[arg-type]
        return None if row is None else row[0]

    def _worker_registered(self) -> bool:
        self.worker.check()
        return bool(self._read("SELECT count(*) FROM procrastinate_workers"))

    def unfinished(self) -> int:
        return int(self._read(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"))

    def stored(self, job_id: int) -> bool:
        status = self._read("SELECT status FROM procrastinate_jobs WHERE id = %s", job_id)
        if status in FAILED:
            raise RuntimeError(f"procrastinate job {job_id} ended {status}")
        return bool(status == "succeeded")

    def pending(self, ids: list[int]) -> list[int]:
        """Those of ``ids`` whose job has not succeeded yet: one read (counted)."""
        with self._lock:
            self.sql_polls += 1
            rows = self._conn.execute(  # type: ignore[call-overload]
                "SELECT id, status FROM procrastinate_jobs WHERE id = ANY(%s)", (ids,)).fetchall()
        return not_succeeded(ids, rows, failed=FAILED, system="procrastinate")

    def deferrer(self, task: str = NOOP, ids: list[int] | None = None,
                 kwargs: dict[str, Any] | None = None) -> MakeCall:
        """Calls that defer one job each; its arguments are ``n=n`` unless given."""
        chosen = self.app.tasks[task]

        def make_call() -> Callable[[int], bool]:
            def defer(n: int) -> bool:
                job_id = chosen.defer(**({"n": n} if kwargs is None else kwargs))
                if ids is not None:
                    ids[n] = job_id
                return True

            return defer

        return self.client_cpu.wrap(make_call)

    def end_to_end(self, clients: int, count: int) -> float:
        ids = [0] * count
        began = hammer(clients, count, self.deferrer(ids=ids)).began_s
        wait_all(ids, self.pending, 60 + count / 10)
        return time.perf_counter() - began

    def hold_jobs(self, clients: int, count: int, key: str, seconds: float) -> float:
        ids = [0] * count
        figures = hammer(clients, count,
                         self.deferrer(HOLD, ids, {"key": key, "seconds": seconds}))
        wait_all(ids, self.pending, 60 + 2 * count * seconds)
        return figures.began_at

    def hold(self) -> None:
        """Nothing runs while held (the worker is stopped): deferring alone is measured."""
        self.worker.pause()

    def submit_held(self, clients: int, count: int, rate: float | None) -> Figures:
        return (hammer(clients, count, self.deferrer()) if rate is None
                else paced(clients, count, rate, self.deferrer()))

    def release(self) -> None:
        self.worker.resume()
        wait_for("procrastinate backlog drained", lambda: self.unfinished() == 0, 600,
                 every=0.2)

    def start_latency(self) -> float:
        key = f"bench:mark:{uuid.uuid4().hex}"
        submitted = time.time()
        job_id = self.app.tasks[MARK].defer(key=key)
        started = pop_mark(self.marks, key)
        wait_for("the mark job ended", lambda: self.stored(job_id), 60)
        time.sleep(IDLE_GAP_S)
        return started - submitted
