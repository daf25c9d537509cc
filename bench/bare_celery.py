"""Bare Celery for the end-to-end bench: the baseline tierq is compared with.

A no-op task (returns its argument), a start mark (pushes ``time.time()`` onto a Redis
list, like ``start_mark.StartMark``) and a hold (keeps its slot, like ``start_mark.Hold``),
on a Redis broker with the Redis result backend, so that "the result is stored" means the
same on every side. Celery's defaults otherwise, except what tierq's own worker also turns
off (mingle, gossip) and the ``fair`` optimisation.

    BENCH_CELERY_URL=redis://127.0.0.1:6379/0 python bench/bare_celery.py   # the worker
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from celery import Celery
from start_mark import hold_slot

URL_ENV = "BENCH_CELERY_URL"
QUEUE = "bare"
NOOP = "bare.noop"
MARK = "bare.mark"
HOLD = "bare.hold"


def make_app(url: str) -> Celery:
    app = Celery("bare_celery", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(name=NOOP)  # type: ignore[untyped-decorator]
    def noop(n: int) -> int:
        return n

    @app.task(name=MARK)  # type: ignore[untyped-decorator]
    def mark(key: str) -> None:
        started = time.time()
        app.backend.client.lpush(key, repr(started))

    @app.task(name=HOLD)  # type: ignore[untyped-decorator]
    def hold(key: str, seconds: float) -> None:
        hold_slot(app.backend.client, key, seconds)

    return app


def main(argv: list[str]) -> None:
    """Run a worker: ``--pool threads --concurrency 4`` unless other options are given."""
    app = make_app(os.environ[URL_ENV])
    options: list[Any] = argv or ["--pool", "threads", "--concurrency", "4"]
    app.worker_main(["worker", "--loglevel", "WARNING", "-O", "fair", "--without-mingle",
                     "--without-gossip", "-Q", QUEUE, *options])


if __name__ == "__main__":
    main(sys.argv[1:])
