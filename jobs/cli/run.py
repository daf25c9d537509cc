"""``tierq up``, ``api``, ``dispatcher``, ``worker``, ``flower``, ``migrate``, ``repair``: the
commands that run a part of the system. The API, Celery and the database are imported inside
each command, so loading this module (for ``tierq --help``) stays quick.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from jobs.cli.common import fail, friendly, one_line, open_runtime, target
from jobs.core.pools import DEFAULT_POOL
from jobs.process.settings import Settings, hide_password, load_settings

if TYPE_CHECKING:
    from fastapi import FastAPI


def configure_logging(level: str = "INFO") -> None:
    """JSON lines in a container, text in a terminal (``jobs.process.logs``)."""
    from jobs.process.logs import configure_logging as configure

    configure(level)


@friendly
def up(
    host: Annotated[str, typer.Option(help="Address the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the API.")] = 8000,
    concurrency: Annotated[int, typer.Option(min=1, help="Worker slots.")] = 2,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="SQLite file, Redis socket, keys (default: ./.tierq).",
                     show_default=False),
    ] = None,
    grace: Annotated[
        float | None,
        typer.Option(min=0.1, max=86400, show_default=False,
                     help="Seconds a stop waits for running jobs before killing; jobs that "
                          "cannot finish in it go back to the queue, uncharged "
                          "(default: policy.stop_grace_s, 10)."),
    ] = None,
    pools: Annotated[
        str | None,
        typer.Option(show_default=False,
                     help="The pools to start a worker for, comma-separated (default: every "
                          "configured pool)."),
    ] = None,
) -> None:
    """Run the whole system on this machine: API, dispatcher, a worker per pool (and Redis)."""
    from jobs.local.up import UpOptions, run_up

    overrides: dict[str, Any] = {"data_dir": data_dir} if data_dir is not None else {}
    settings = load_settings(**overrides)
    configured = settings.pool_set().names
    chosen = configured if pools is None else tuple(
        dict.fromkeys(name.strip() for name in pools.split(",") if name.strip()))
    unknown = [name for name in chosen if name not in configured]
    if unknown:
        fail(f"--pools: no pool {', '.join(map(repr, unknown))} is configured; configured: "
             f"{', '.join(configured)}", 2)
    configure_logging()
    options = UpOptions(host=host, port=port, concurrency=concurrency, data_dir=settings.home(),
                        grace_s=grace if grace is not None else settings.policy.stop_grace_s,
                        pools=chosen)
    run_up(options, Console())


def api_app() -> FastAPI:
    """Zero-argument factory for uvicorn (``jobs.cli.run:api_app``), also in its worker
    processes."""
    if not logging.getLogger().handlers:  # a server process of its own (--workers)
        configure_logging()
    from jobs.api.app import create_app

    return create_app(load_settings())


@friendly
def api(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="Server processes.")] = 1,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run the HTTP API (uvicorn)."""
    import uvicorn

    settings = load_settings()  # refuse a bad configuration, or no system, before serving
    target(settings.describe_target())
    configure_logging(log_level)
    # log_config=None: uvicorn's own lines go through the root handler too, in the same
    # format as tierq's; each server process configures it in ``api_app``.
    from jobs.api.http_protocol import CoalescingProtocol

    uvicorn.run("jobs.cli.run:api_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, log_config=None, http=CoalescingProtocol)


@friendly
def dispatcher() -> None:
    """Run the dispatcher loop (one leader; extra ones wait as standbys)."""

    settings = load_settings()
    target(settings.describe_target())
    configure_logging()
    serve(settings)


@friendly
def worker(
    concurrency: Annotated[int | None, typer.Option(
        min=1, show_default=False,
        help="Jobs run at once (default: 1 on a GPU, 2 on a CPU; TIERQ_DEVICE names the "
             "device).")] = None,
    pool: Annotated[str | None, typer.Option(
        show_default=False,
        help="The pool to join ([pools.NAME] in the configuration; default: TIERQ_POOL, else "
             "default): this worker runs its kinds only.")] = None,
    celery_pool: Annotated[Literal["threads", "prefork", "solo"] | None, typer.Option(
        show_default=False, help="Celery's execution pool (default: threads).")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Run a Celery worker for its pool's tier queues."""
    from workers.embedding import device
    from workers.main import pool_and_celery_pool, run_worker
    from workers.registration import default_slots

    if concurrency is None:
        concurrency = default_slots(device())
    joins, execution = pool_and_celery_pool(pool, celery_pool)
    settings = load_settings(**({"pool": joins} if joins else {}))
    target(f"{settings.describe_target()} · broker "
           f"{hide_password(settings.resolved_broker_url())} · pool {settings.pool}")
    code = run_worker(settings, concurrency=concurrency, pool=execution, loglevel=loglevel)
    if code:
        raise typer.Exit(code)


@friendly
def flower(
    port: Annotated[
        int, typer.Option(envvar="FLOWER_PORT", help="Port of the Flower web UI.")
    ] = 5555,
    address: Annotated[str, typer.Option(
        envvar="FLOWER_ADDRESS",
        help="Address to listen on; 0.0.0.0 for every interface (needs authentication).",
    )] = "127.0.0.1",
) -> None:
    """Run Flower (Celery's monitor) against the broker, on 127.0.0.1 unless --address.

    Flower shows every task with its arguments and can control workers: it refuses to listen
    beyond this machine unprotected. Set FLOWER_BASIC_AUTH=user:password in the environment
    (several pairs comma-separated), or Flower's OAuth (FLOWER_AUTH, FLOWER_OAUTH2_*).
    """
    from workers.flower import require_auth, run_flower

    require_auth(address, os.environ)
    run_flower(load_settings(), port=port, address=address)


@friendly
def migrate(
    wait: Annotated[
        float, typer.Option(min=0, help="Seconds to wait for the database to answer.")
    ] = 60.0,
) -> None:
    """Bring the database schema to the latest revision (waiting for the database to answer,
    as it may still be starting)."""
    import sqlalchemy.exc
    import tenacity

    from jobs.store.migrate import current, upgrade

    settings = load_settings()
    url = settings.resolved_database_url(create=True)
    target(f"database {hide_password(url)}")
    console = Console(stderr=True, highlight=False, soft_wrap=True)

    def say_waiting(state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        console.print(f"waiting for the database: {one_line(error) if error else ''}",
                      style="yellow", markup=False)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(sqlalchemy.exc.OperationalError),
        wait=tenacity.wait_exponential(multiplier=0.5, max=5),
        stop=tenacity.stop_after_delay(wait),
        before_sleep=say_waiting,
        reraise=True,
    )
    retrying(upgrade, url)
    Console().print(f"database at revision {current(url)}", highlight=False)


@friendly
def repair(
    force: Annotated[
        bool, typer.Option("--force", help="Rebuild even while a dispatcher leads.")
    ] = False,
) -> None:
    """Rebuild the Redis index from SQL: queued jobs, leases of running jobs, caps.

    A leading dispatcher reconciles the index with SQL by itself every few seconds, so this
    refuses while one leads (--force to run anyway: it never undoes a dispatch or a retry
    newer than its SQL read, and deletes no key wholesale)."""
    import redis
    import sqlalchemy.exc

    from jobs.dispatch.rebuild import RebuildStats
    from jobs.dispatch.reconciler import Reconciler

    runtime = open_runtime(announce=True)
    try:
        leader = runtime.index.leader(now=runtime.clock())
        if leader is not None and not force:
            fail(f"a dispatcher leads ({leader}) and keeps the index in line with SQL by "
                 "itself; stop the dispatchers first, or pass --force", 1)
        passes = [Reconciler(pool).full_pass(runtime.clock()) for pool in runtime.every_pool()]
        stats = RebuildStats(**{name: sum(getattr(one, name) for one in passes)
                                for name in ("queued", "leased", "released", "removed",
                                             "kept_uncommitted")})
    except (redis.RedisError, sqlalchemy.exc.OperationalError) as exc:
        fail(f"cannot rebuild the index: {exc}", 1)
    finally:
        runtime.close()
    table = Table("", "jobs", title="index rebuilt from SQL")
    table.columns[1].justify = "right"
    table.add_row("queued, indexed with their order keys", str(stats.queued))
    table.add_row("in flight, holding a lease", str(stats.leased))
    table.add_row("finished meanwhile, lease released", str(stats.released))
    table.add_row("stale entries removed", str(stats.removed))
    table.add_row("not committed yet, kept", str(stats.kept_uncommitted))
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)


def serve(settings: Settings) -> None:
    """Run the dispatcher until SIGTERM or SIGINT; a leader resigns on the way out, so a
    standby takes over without waiting out the lock's TTL."""
    import functools
    import signal
    import threading

    import redis

    from jobs.api.webhook_bodies import render
    from jobs.dispatch.dispatcher import Dispatcher
    from jobs.dispatch.leadership import Leadership
    from jobs.dispatch.loop import run_forever
    from jobs.dispatch.pools import PoolDispatchers
    from jobs.process.runtime import Runtime
    from jobs.service.deliverer import Deliverer
    from workers.publisher import CeleryPublisher  # the publishing adapter: Celery stays there

    runtime = Runtime.from_settings(settings.model_copy(update={"pool": DEFAULT_POOL}),
                                    dispatcher=True)
    publishers = {name: CeleryPublisher(settings, pool=name) for name in runtime.pools.names}
    dispatchers = [Dispatcher(runtime.for_pool(name), publisher)
                   for name, publisher in publishers.items()]
    leadership = Leadership(runtime.index, ttl_s=runtime.policy.leader_ttl_s)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logger = logging.getLogger("tierq.dispatcher")
    logger.info("dispatcher.started", extra={"owner": leadership.owner})
    # Every dispatcher, leader or standby, delivers webhooks: events are claimed in SQL.
    deliverer = threading.Thread(
        target=Deliverer(runtime, functools.partial(render, runtime)).run, args=(stop,),
        name="webhooks", daemon=True)
    deliverer.start()
    try:
        run_forever(dispatchers[0] if len(dispatchers) == 1 else PoolDispatchers(dispatchers),
                    stop, leadership)
    finally:
        stop.set()
        deliverer.join(timeout=5)
        try:
            leadership.resign(runtime.clock())
        except redis.RedisError:
            logger.warning("dispatcher.resign_failed", exc_info=True)
        for publisher in publishers.values():
            publisher.close()
        runtime.close()
        logger.info("dispatcher.stopped")
