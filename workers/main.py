"""Run a Celery worker for tierq: ``run_worker(settings, concurrency=N)``.

Also runnable as ``python -m workers.main --concurrency N [--pool NAME]`` with settings from
the environment (``TIERQ_DATABASE_URL``, ``TIERQ_REDIS_URL``, ``TIERQ_KEY_PREFIX``, ...).

A worker joins one pool (``settings.pool``, ``jobs.core.pools``): it consumes that pool's
tier queues, registers its slots and the kinds it runs in that pool's index, and sets up and
runs the kinds of that pool only. It refuses to start when it has no handler for a kind its
pool names; the default pool, which takes every kind no pool names, may hold workers of
different kinds: it consumes the queue of each kind it runs too, where the dispatcher sends
a kind's jobs while not every live worker runs it (``jobs.dispatch.routing``).
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
from jobs.execution.registry import HandlerRegistry
from jobs.process import logs
from jobs.process.settings import Settings, load_settings
from workers import stopping
from workers.app import kind_queue, make_celery, names_of, own_queue
from workers.handover import InProcess
from workers.tasks import TASK_NAME, resources_of

# Celery pools by the names the CLI takes; threads wake the event loop as a task ends.
POOLS = {"threads": "workers.pool:TaskPool"}
# Celery's execution pools, by the names ``--celery-pool`` takes.
CELERY_POOLS = ("threads", "prefork", "solo")


def pool_and_celery_pool(pool: str | None, celery_pool: str | None) -> tuple[str | None, str]:
    """``--pool`` names the tierq pool a worker joins; ``--celery-pool`` Celery's execution
    pool. ``--pool threads|prefork|solo`` (Celery's pool by its older spelling, names no
    tierq pool may take) still means Celery's."""
    if pool in CELERY_POOLS and celery_pool is None:
        return None, pool
    return pool, celery_pool or "threads"


def pool_kinds(settings: Settings, registry: HandlerRegistry) -> list[str]:
    """The kinds this worker runs: those of its pool it has handlers for. Raises
    ``ConfigError`` naming the kinds of its pool it has no handler for."""
    pools = settings.pool_set()
    missing = sorted(pools.spec(settings.pool).kinds - set(registry.kinds()))
    if missing:
        raise ConfigError(
            f"pool {settings.pool!r} runs {', '.join(missing)}, which this worker has no "
            "handler for (install the extra or package that provides it, or name its "
            "module in TIERQ_HANDLERS)")
    return pools.kinds_of(settings.pool, registry.kinds())

def configure_logging(loglevel: str) -> None:
    """JSON lines in a container, text in a terminal (``jobs.process.logs``)."""
    logs.configure_logging(loglevel)


def worker_hostname() -> str:
    """A worker id unique per process: it names the worker's slots in the index, and its
    pid tells ``tierq up`` which registration is its own child's
    (``jobs.local.up.wait_workers``)."""
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
    kinds = pool_kinds(settings, registry)  # a kind of its pool it cannot run stops it too
    stopping.install(settings)
    hostname = hostname or worker_hostname()
    own = own_queue(settings, hostname)
    app.amqp.queues.add(own)
    resources_of(app).own_queue = own.name
    resources_of(app).kinds = kinds  # registered, so that only its kinds reach it
    # Each kind's own queue: where the dispatcher sends its jobs while not every live worker
    # of the pool runs it (``jobs.dispatch.routing``).
    by_kind = [kind_queue(settings, kind) for kind in kinds]
    for queue in by_kind:
        app.amqp.queues.add(queue)
    if POOLS.get(pool, pool) == POOLS["threads"]:
        resources_of(app).in_process = InProcess(app, TASK_NAME, own.name)
        # A prefork child exits alone (its pool starts another); this process is every slot.
        limits.set_process_end(stopping.end_worker_process)
    if settings.worker_setup == "eager":  # "lazy": each kind before its first job here
        if pool == "prefork":
            # Each child sets its handlers up as it starts, before it takes a job.
            signals.worker_process_init.connect(lambda **_: registry.setup(kinds), weak=False)
        else:
            # Here, before the worker registers its slots: no job pays for it.
            registry.setup(kinds)
    worker = app.Worker(
        hostname=hostname,
        pool_cls=POOLS.get(pool, pool),
        concurrency=concurrency,
        loglevel=loglevel.upper(),
        queues=[*names_of(settings).queues(list(settings.tiers)), own.name,
                *(queue.name for queue in by_kind)],
        without_mingle=True,
        without_gossip=True,
        optimization="fair",
    )
    worker.start()
    return int(worker.exitcode or 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.main", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--pool", default=None,
                        help="the tierq pool to join (default: TIERQ_POOL, else default)")
    parser.add_argument("--celery-pool", choices=CELERY_POOLS, default=None)
    parser.add_argument("--loglevel", default="INFO")
    parser.add_argument("--hostname", default=None)
    args = parser.parse_args(argv)
    joins, celery_pool = pool_and_celery_pool(args.pool, args.celery_pool)
    try:
        settings = load_settings(**({"pool": joins} if joins else {}))
    except ConfigError as exc:
        parser.exit(2, f"{exc}\n")
    try:
        return run_worker(
            settings,
            concurrency=args.concurrency,
            pool=celery_pool,
            loglevel=args.loglevel,
            hostname=args.hostname,
        )
    except ConfigError as exc:
        parser.exit(2, f"{exc}\n")


if __name__ == "__main__":
    sys.exit(main())
