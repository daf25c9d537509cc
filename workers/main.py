"""Run a Celery worker for tierq: ``run_worker(settings, concurrency=N)``.

Also runnable as ``python -m workers.main --concurrency N`` with settings from the
environment (``TIERQ_DATABASE_URL``, ``TIERQ_REDIS_URL``, ``TIERQ_KEY_PREFIX``, ...).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid
from collections.abc import Sequence

from celery import signals

from jobs.core.errors import ConfigError
from jobs.execution import limits
from jobs.process import logs
from jobs.process.settings import Settings, load_settings
from workers import stopping
from workers.app import make_celery, names_of, own_queue
from workers.handover import InProcess
from workers.tasks import TASK_NAME, resources_of

# Celery pools by the names the CLI takes; threads wake the event loop as a task ends.
POOLS = {"threads": "workers.pool:TaskPool"}

def configure_logging(loglevel: str) -> None:
    """JSON lines in a container, text in a terminal (``jobs.process.logs``)."""
    logs.configure_logging(loglevel)


def worker_hostname() -> str:
    """A worker id unique per process: it names the worker's slots in the index."""
    return f"tierq-{os.getpid()}-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"


def run_worker(
    settings: Settings,
    *,
    concurrency: int,
    pool: str = "threads",
    loglevel: str = "INFO",
    hostname: str | None = None,
) -> int:
    """Consume every tier's queue with ``concurrency`` slots until stopped (SIGTERM: warm
    shutdown; running jobs finish, or are handed back near the end of the stop grace,
    ``workers.stopping``). Handlers are set up first (``worker_setup``); a handler past its
    run-time limit ends the process running it (``jobs.execution.limits``). Returns the
    worker's exit code."""
    if concurrency < 1:
        raise ConfigError("concurrency: must be at least 1")
    configure_logging(loglevel)
    app = make_celery(settings)
    registry = resources_of(app).registry()  # a bad TIERQ_HANDLERS stops the worker now
    stopping.install(settings)
    hostname = hostname or worker_hostname()
    own = own_queue(settings, hostname)
    app.amqp.queues.add(own)
    resources_of(app).own_queue = own.name
    if POOLS.get(pool, pool) == POOLS["threads"]:
        resources_of(app).in_process = InProcess(app, TASK_NAME, own.name)
        # A prefork child exits alone (its pool starts another); this process is every slot.
        limits.set_process_end(stopping.end_worker_process)
    if settings.worker_setup == "eager":  # "lazy": each kind before its first job here
        if pool == "prefork":
            # Each child sets its handlers up as it starts, before it takes a job.
            signals.worker_process_init.connect(lambda **_: registry.setup(), weak=False)
        else:
            # Here, before the worker registers its slots: no job pays for it.
            registry.setup()
    worker = app.Worker(
        hostname=hostname,
        pool_cls=POOLS.get(pool, pool),
        concurrency=concurrency,
        loglevel=loglevel.upper(),
        queues=[*names_of(settings).queues(list(settings.tiers)), own.name],
        without_mingle=True,
        without_gossip=True,
        optimization="fair",
    )
    worker.start()
    return int(worker.exitcode or 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.main", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--pool", default="threads")
    parser.add_argument("--loglevel", default="INFO")
    parser.add_argument("--hostname", default=None)
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as exc:
        parser.exit(2, f"{exc}\n")
    try:
        return run_worker(
            settings,
            concurrency=args.concurrency,
            pool=args.pool,
            loglevel=args.loglevel,
            hostname=args.hostname,
        )
    except ConfigError as exc:
        parser.exit(2, f"{exc}\n")


if __name__ == "__main__":
    sys.exit(main())
