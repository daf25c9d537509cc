"""procrastinate for the end-to-end bench: the durable PostgreSQL queue tierq is compared with.

An App on the psycopg connector, set up as its documentation shows, with the same three tasks
as ``bare_celery.py``: a no-op (returns its argument), a start mark (pushes ``time.time()``
onto a Redis list, like ``start_mark.StartMark``) and a hold (keeps its slot, like
``start_mark.Hold``). Tasks are plain functions: the worker runs each in a thread of its own,
``concurrency`` of them at once. procrastinate's defaults otherwise (LISTEN/NOTIFY wake-ups,
finished jobs kept in ``procrastinate_jobs`` with their status).

    BENCH_PROCRASTINATE_URL=postgresql://postgres@127.0.0.1/db \\
    BENCH_MARK_REDIS_URL=redis://127.0.0.1:6379/0 python bench/bare_procrastinate.py  # worker
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import procrastinate
from start_mark import hold_slot, marks

URL_ENV = "BENCH_PROCRASTINATE_URL"
NOOP = "bare.noop"
MARK = "bare.mark"
HOLD = "bare.hold"


def make_app(conninfo: str, **pool: Any) -> procrastinate.App:
    """The app; ``pool`` goes to psycopg's connection pool (its size, for the clients)."""
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo, **pool))

    @app.task(name=NOOP)
    def noop(n: int) -> int:
        return n

    @app.task(name=MARK)
    def mark(key: str) -> None:
        marks().lpush(key, repr(time.time()))

    @app.task(name=HOLD)
    def hold(key: str, seconds: float) -> None:
        hold_slot(marks(), key, seconds)

    return app


def main(argv: list[str]) -> None:
    """Run a worker with ``argv[0]`` concurrent jobs (4), until SIGTERM."""
    logging.basicConfig(level=logging.WARNING)
    app = make_app(os.environ[URL_ENV])
    app.run_worker(concurrency=int(argv[0]) if argv else 4)


if __name__ == "__main__":
    main(sys.argv[1:])
