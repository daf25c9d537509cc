"""The ``tierq`` command: run the parts, manage tenants, submit jobs, explain the policy.

Settings are read inside each command (``load_settings``), never at import; an impossible
configuration prints its message in red and exits 2. Every command finds the system the same
way (``jobs.process.settings``: flag, ``TIERQ_*``, the config file, the data directory of ``tierq
up``), refuses in one line when there is none, and names on stderr what it acts on before it
changes anything. Heavy imports (the API, Celery) happen
inside the commands that need them, so ``tierq --help`` and ``tierq policy`` stay quick.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, ParamSpec

import typer
from rich.console import Console
from rich.table import Table

from jobs.core.errors import ConfigError, InvalidRequest, TierqError
from jobs.core.policy import (
    MAX_TENANT_BURST,
    MAX_TENANT_CAP,
    MAX_TENANT_QUEUED,
    MAX_TENANT_RATE_PER_S,
)
from jobs.process.settings import Settings, hide_password, load_settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from jobs.client.http import Client
    from jobs.process.runtime import Runtime

P = ParamSpec("P")

ApiUrl = Annotated[
    str | None,
    typer.Option("--api", envvar="TIERQ_API_URL",
                 help="Base URL of the tierq API (default: that of the running `tierq up`).",
                 show_default=False),
]
ApiKey = Annotated[
    str | None, typer.Option("--key", envvar="TIERQ_API_KEY", help="The tenant's API key.")
]


def _tierq() -> str:
    """How to call tierq for the same system: with the data directory given, if one was."""
    data_dir = os.environ.get("TIERQ_DATA_DIR")
    if data_dir and Path(data_dir).resolve() != (Path.cwd() / ".tierq").resolve():
        return f"tierq --data-dir {data_dir}"
    return "tierq"


def _target(line: str) -> None:
    """Name, on stderr, the system a command is about to act on."""
    Console(stderr=True, soft_wrap=True, highlight=False).print(
        f"→ {line}", style="dim", markup=False)


def _fail(message: str, code: int) -> NoReturn:
    Console(stderr=True, soft_wrap=True).print(message, style="red", markup=False, highlight=False)
    raise typer.Exit(code)


# Set by ``--debug``: an unexpected error shows its traceback instead of one line.
_DEBUG = {"on": os.environ.get("TIERQ_DEBUG", "") not in ("", "0")}


def _friendly(func: Callable[P, None]) -> Callable[P, None]:
    """Print every error a user can cause as one red line, no traceback: exit 2 for a bad
    configuration or input (the caller's to fix), 1 for anything else (a database or Redis
    that cannot be reached, a schema not migrated). ``--debug`` shows the traceback."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            func(*args, **kwargs)
        except (ConfigError, InvalidRequest) as exc:
            _fail(exc.message, 2)
        except TierqError as exc:
            _fail(exc.message, 1)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:
            if _DEBUG["on"]:
                raise
            _fail(f"{_one_line(exc)} (run with --debug for the traceback)", 1)

    return wrapper


def _one_line(exc: BaseException) -> str:
    """What went wrong, in the user's terms where the cause is known."""
    import redis
    import sqlalchemy.exc

    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        if "no such table" in first or ("does not exist" in first and "relation" in first):
            return f"the database has no tierq schema: run `tierq migrate` first ({first})"
        if isinstance(exc, sqlalchemy.exc.OperationalError):
            return f"the database cannot be reached: {first}"
        return f"the database refused: {first}"
    if isinstance(exc, redis.RedisError):
        return f"Redis cannot be reached: {first}"
    return f"{type(exc).__name__}: {first}"


def configure_logging(level: str = "INFO") -> None:
    """JSON lines in a container, text in a terminal (``jobs.process.logs``)."""
    from jobs.process.logs import configure_logging as configure

    configure(level)


# --- running the parts ------------------------------------------------------------------


@_friendly
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
) -> None:
    """Run the whole system on this machine: API, dispatcher, worker (and Redis)."""
    from jobs.local.supervisor import UpOptions, run_up

    overrides: dict[str, Any] = {"data_dir": data_dir} if data_dir is not None else {}
    settings = load_settings(**overrides)
    configure_logging()
    options = UpOptions(host=host, port=port, concurrency=concurrency, data_dir=settings.home(),
                        grace_s=grace if grace is not None else settings.policy.stop_grace_s)
    run_up(options, Console())


def api_app() -> FastAPI:
    """Zero-argument factory for uvicorn (``jobs.cli.main:api_app``), also in its worker
    processes."""
    if not logging.getLogger().handlers:  # a server process of its own (--workers)
        configure_logging()
    from jobs.api.app import create_app

    return create_app(load_settings())


@_friendly
def api(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="Server processes.")] = 1,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run the HTTP API (uvicorn)."""
    import uvicorn

    settings = load_settings()  # refuse a bad configuration, or no system, before serving
    _target(settings.describe_target())
    configure_logging(log_level)
    # log_config=None: uvicorn's own lines go through the root handler too, in the same
    # format as tierq's; each server process configures it in ``api_app``.
    uvicorn.run("jobs.cli.main:api_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, log_config=None)


@_friendly
def dispatcher() -> None:
    """Run the dispatcher loop (one leader; extra ones wait as standbys)."""

    settings = load_settings()
    _target(settings.describe_target())
    configure_logging()
    serve(settings)


@_friendly
def worker(
    concurrency: Annotated[int | None, typer.Option(
        min=1, show_default=False,
        help="Jobs run at once (default: 1 on a GPU, 2 on a CPU; TIERQ_DEVICE names the "
             "device).")] = None,
    pool: Annotated[Literal["threads", "prefork", "solo"], typer.Option(help="Celery pool.")] = (
        "threads"
    ),
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Run a Celery worker for every tier's queue."""
    from workers.embedding import device
    from workers.main import run_worker
    from workers.registration import default_slots

    if concurrency is None:
        concurrency = default_slots(device())

    settings = load_settings()
    _target(f"{settings.describe_target()} · broker "
            f"{hide_password(settings.resolved_broker_url())}")
    code = run_worker(settings, concurrency=concurrency, pool=pool, loglevel=loglevel)
    if code:
        raise typer.Exit(code)


@_friendly
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


@_friendly
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
    _target(f"database {hide_password(url)}")
    console = Console(stderr=True, highlight=False, soft_wrap=True)

    def say_waiting(state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        console.print(f"waiting for the database: {_one_line(error) if error else ''}",
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


# --- tenants ----------------------------------------------------------------------------


def _runtime(*, announce: bool) -> Runtime:
    """The system's connections; ``announce``: say on stderr which system is changed."""
    from jobs.process.runtime import Runtime

    settings = load_settings()
    if announce:
        _target(settings.describe_target())
    return Runtime.from_settings(settings)


@_friendly
def tenants_create(
    name: Annotated[str, typer.Argument(help="Unique tenant name.")],
    tier: Annotated[str, typer.Option(help="The tenant's tier (see `tierq policy`).")],
) -> None:
    """Create a tenant in the database and print its API key (shown once)."""
    from sqlalchemy.exc import OperationalError

    from jobs.service.tenants import create_tenant

    runtime = _runtime(announce=True)
    try:
        tenant, key = create_tenant(runtime, name=name, tier=tier)
    except OperationalError as exc:
        _fail(f"database not ready ({exc.orig}): run `tierq migrate` or `tierq up` first", 1)
    finally:
        runtime.close()
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"tenant {tenant.name}  id {tenant.id}  tier {tenant.tier}")
    console.print(f"API key (shown once, store it now): [bold]{key}[/]")
    console.print(f"Use it:  export TIERQ_API_KEY={key}", markup=False)
    console.print(f"         {_tierq()} submit echo --payload '{{\"a\": 1}}' --wait", markup=False)


@_friendly
def tenants_list() -> None:
    """List the tenants."""
    from datetime import UTC, datetime

    from jobs.service.tenants import list_tenants

    runtime = _runtime(announce=False)
    try:
        tenants = list_tenants(runtime)
    finally:
        runtime.close()
    table = Table("name", "tier")
    table.add_column("id", overflow="fold")  # ids are copied from here: never cut them
    table.add_column("created (UTC)", overflow="fold")
    table.add_column("overrides", overflow="fold")
    for t in tenants:
        overrides = {"cap": t.cap, "max_queued": t.max_queued, "rate_per_s": t.rate_per_s}
        shown = ", ".join(f"{k}={v}" for k, v in overrides.items() if v is not None)
        created = datetime.fromtimestamp(t.created_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(t.name, t.tier, t.id, created, shown or "-")
    Console().print(table)


def _tenant_ref(runtime: Runtime, ref: str) -> str:
    """A tenant's id from its name or its id: one indexed read either way."""
    from jobs.core.errors import NotFound
    from jobs.store import tenants as tenants_sql

    with runtime.sessions() as session:
        tenant = tenants_sql.tenant_by_name(session, ref)
        if tenant is None and _is_uuid(ref):
            tenant = tenants_sql.get_tenant(session, ref)
    if tenant is None:
        raise NotFound(f"no tenant named or with id {ref!r} (see `tierq tenants list`)")
    return tenant.id


def _is_uuid(text: str) -> bool:
    import uuid

    try:
        return str(uuid.UUID(text)) == text.lower()
    except ValueError:
        return False


@_friendly
def tenants_rotate_key(
    tenant: Annotated[str, typer.Argument(help="The tenant's name or id.")],
) -> None:
    """Give a tenant a new API key and print it; the old key stops working at once."""
    from jobs.service.tenants import rotate_key

    runtime = _runtime(announce=True)
    try:
        updated, key = rotate_key(runtime, _tenant_ref(runtime, tenant))
    finally:
        runtime.close()
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"tenant {updated.name}  id {updated.id}: the old key no longer works")
    console.print(f"new API key (shown once, store it now): [bold]{key}[/]")


@_friendly
def tenants_update(
    tenant: Annotated[str, typer.Argument(help="The tenant's name or id.")],
    tier: Annotated[str | None, typer.Option(help="Move the tenant to this tier.")] = None,
    cap: Annotated[
        int | None, typer.Option(min=1, max=MAX_TENANT_CAP, help="Jobs running at once.")
    ] = None,
    max_queued: Annotated[
        int | None, typer.Option(min=1, max=MAX_TENANT_QUEUED, help="Queued quota.")
    ] = None,
    rate_per_s: Annotated[float | None, typer.Option(help="Submits per second.")] = None,
    rate_burst: Annotated[
        int | None, typer.Option(min=1, max=MAX_TENANT_BURST, help="Submit burst.")
    ] = None,
    clear: Annotated[
        list[str] | None,
        typer.Option(help="Drop an override (cap, max_queued, rate_per_s, rate_burst): the "
                          "tier's value applies again. Repeatable."),
    ] = None,
) -> None:
    """Change a tenant's tier or its overrides of the tier's policy."""
    from jobs.service.tenants import OVERRIDES, UNCHANGED, update_tenant

    if rate_per_s is not None and not (
        math.isfinite(rate_per_s) and 0 < rate_per_s <= MAX_TENANT_RATE_PER_S
    ):
        _fail(f"--rate-per-s must be a number in (0, {MAX_TENANT_RATE_PER_S:g}], not "
              f"{rate_per_s}", 2)
    given: dict[str, Any] = {"cap": cap, "max_queued": max_queued, "rate_per_s": rate_per_s,
                             "rate_burst": rate_burst}
    changes: dict[str, Any] = {k: (UNCHANGED if v is None else v) for k, v in given.items()}
    for name in clear or []:
        if name not in OVERRIDES:
            _fail(f"--clear takes one of {', '.join(OVERRIDES)}, not {name!r}", 2)
        changes[name] = None
    runtime = _runtime(announce=True)
    try:
        updated = update_tenant(runtime, _tenant_ref(runtime, tenant), tier=tier, **changes)
    finally:
        runtime.close()
    overrides = {"cap": updated.cap, "max_queued": updated.max_queued,
                 "rate_per_s": updated.rate_per_s, "rate_burst": updated.rate_burst}
    shown = ", ".join(f"{k}={v}" for k, v in overrides.items() if v is not None) or "none"
    Console(highlight=False, soft_wrap=True).print(
        f"tenant {updated.name}  tier {updated.tier}  overrides: {shown}")


# --- jobs over HTTP ---------------------------------------------------------------------


def _client(api_url: str | None, key: str | None, *, announce: bool = False) -> Client:
    """A client for the API found as every command finds the system (``--api``,
    ``TIERQ_API_URL``, the config file, the running ``tierq up``)."""
    from jobs.client.http import Client

    overrides: dict[str, Any] = {"api_url": api_url} if api_url else {}
    url = load_settings(**overrides).resolved_api_url()
    if not key:
        _fail("no API key: pass --key or set TIERQ_API_KEY (tierq tenants create prints one)", 2)
    if announce:
        _target(f"API {url}")
    return Client(url, key)


def _payload(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except ValueError as exc:
        _fail(f"--payload is not valid JSON: {exc}", 2)
    if not isinstance(payload, dict):
        _fail("--payload must be a JSON object, e.g. '{\"seconds\": 2}'", 2)
    return payload


@_friendly
def submit(
    kind: Annotated[str, typer.Argument(help="Job kind, e.g. sleep or echo.")],
    payload: Annotated[str, typer.Option(help="The job's payload, a JSON object.")] = "{}",
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the result.")] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="Unique per tenant.")] = None,
    max_wait: Annotated[
        float | None, typer.Option(help="Expire the job if it has not started by then (s).")
    ] = None,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Submit a job; with --wait, follow it and print its result."""
    from jobs.client.http import ApiError, Refused

    body = _payload(payload)
    if max_wait is not None and not (math.isfinite(max_wait) and max_wait > 0):
        _fail(f"--max-wait must be a positive number of seconds, not {max_wait}", 2)
    console = Console(highlight=False, soft_wrap=True)
    with _client(api_url, key, announce=True) as client:
        try:
            job = client.submit(kind, body, idempotency_key=idempotency_key, max_wait_s=max_wait)
        except Refused as exc:
            retry = f"{exc.retry_after_s:g}" if exc.retry_after_s is not None else "a few"
            _fail(f"refused ({exc.type}): {exc.message} Retry after {retry} s.", 2)
        except ApiError as exc:
            _fail(f"not submitted: {exc}", 2)
        console.print(
            f"job {job.get('id')}  tier {job.get('tier')}  position {job.get('queue_position')}"
            f"  estimated wait {job.get('estimated_wait_s')} s"
        )
        if wait:
            _follow(client, str(job["id"]), console)


def _follow(client: Client, job_id: str, console: Console) -> None:
    """Show the job's progress until it is terminal; print the result and set the exit code."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from jobs.client.http import ApiError

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("queued", total=None)

            def update(job: dict[str, Any]) -> None:
                status = job.get("status")
                where = f" · position {job.get('queue_position')}" if status == "queued" else ""
                progress.update(task, description=f"{status}{where}")

            final = client.wait(job_id, on_update=update)
            outcome = client.result(job_id) if final.get("status") == "succeeded" else final
    except ApiError as exc:
        _fail(f"lost track of job {job_id}: {exc}", 1)
    except KeyboardInterrupt:
        _fail(f"stopped waiting; the job goes on: tierq status {job_id}", 130)
    if final.get("status") != "succeeded":
        _fail(f"job {job_id} {final.get('status')}: {final.get('error')}", 1)
    console.print_json(json.dumps(outcome.get("result")))


@_friendly
def upload(
    file: Annotated[Path, typer.Argument(help="The document: PDF, text or markdown.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the result.")] = False,
    kind: Annotated[str, typer.Option(help="The job kind to run on it.")] = "document.embed",
    max_wait: Annotated[
        float | None, typer.Option(help="Expire the job if it has not started by then (s).")
    ] = None,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Upload a document and submit a job for it; with --wait, follow it and print its
    result."""
    from jobs.client.http import ApiError, Refused

    if not file.is_file():
        _fail(f"no such file: {file}", 2)
    if max_wait is not None and not (math.isfinite(max_wait) and max_wait > 0):
        _fail(f"--max-wait must be a positive number of seconds, not {max_wait}", 2)
    console = Console(highlight=False, soft_wrap=True)
    with _client(api_url, key, announce=True) as client:
        try:
            job = client.upload(file, kind=kind, max_wait_s=max_wait)
        except Refused as exc:
            retry = f"{exc.retry_after_s:g}" if exc.retry_after_s is not None else "a few"
            _fail(f"refused ({exc.type}): {exc.message} Retry after {retry} s.", 2)
        except ApiError as exc:
            _fail(f"not uploaded: {exc}", 2)
        document = job.get("document") or {}
        console.print(
            f"job {job.get('id')}  {document.get('content_type')}  {document.get('bytes')} bytes"
            f"  sha256 {document.get('sha256')}  position {job.get('queue_position')}"
        )
        if wait:
            _follow(client, str(job["id"]), console)


@_friendly
def status(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Print a job's status as JSON."""
    from jobs.client.http import ApiError

    with _client(api_url, key) as client:
        try:
            job = client.get(job_id)
        except ApiError as exc:
            _fail(str(exc), 1)
    Console().print_json(json.dumps(job))


# --- repair -----------------------------------------------------------------------------


@_friendly
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

    from jobs.dispatch.reconciler import Reconciler

    runtime = _runtime(announce=True)
    try:
        leader = runtime.index.leader(now=runtime.clock())
        if leader is not None and not force:
            _fail(f"a dispatcher leads ({leader}) and keeps the index in line with SQL by "
                  "itself; stop the dispatchers first, or pass --force", 1)
        stats = Reconciler(runtime).full_pass(runtime.clock())
    except (redis.RedisError, sqlalchemy.exc.OperationalError) as exc:
        _fail(f"cannot rebuild the index: {exc}", 1)
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


JobId = Annotated[str, typer.Argument(help="The job's id.")]


@_friendly
def jobs_get(
    job_id: JobId,
    wait: Annotated[
        float | None, typer.Option(min=0, max=60, help="Long-poll up to this many seconds.")
    ] = None,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Print a job (as JSON); with --wait, once its status changes or the time is up."""
    with _client(api_url, key) as client:
        job = client.get(job_id, wait=wait)
    Console(highlight=False, soft_wrap=True).print_json(json.dumps(job))


@_friendly
def jobs_list(
    status: Annotated[
        str | None,
        typer.Option(help="Only jobs in this state (waiting, queued, dispatched, running, "
                          "succeeded, failed, cancelled, expired)."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Jobs on this page.")] = 20,
    cursor: Annotated[
        str | None, typer.Option(help="Continue after a page (its next_cursor).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the page as JSON, for scripts.")
    ] = False,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """List this tenant's jobs, newest first, a page at a time."""
    with _client(api_url, key) as client:
        page = client.list_jobs(status=status, limit=limit, cursor=cursor)
    console = Console(highlight=False, soft_wrap=not as_json)
    if as_json:
        console.print_json(json.dumps(page))
        return
    console.print(jobs_table(page.get("jobs", []), console.width))
    following = page.get("next_cursor")
    if following:
        console.print(f"more: tierq jobs list --cursor {following}", style="dim", markup=False)


def jobs_table(jobs: list[dict[str, Any]], width: int) -> Table:
    """One row a job, in ``width`` columns: the id and status are never cut (ids are copied
    from here); the error is cut first, then the columns that matter least are left out."""
    columns: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = [
        ("id", 36, lambda job: str(job.get("id"))),
        ("status", 10, lambda job: str(job.get("status"))),
        ("kind", 8, lambda job: str(job.get("kind"))),
        ("created (UTC)", 14, lambda job: _short_time(job.get("created_at"))),
        ("waited", 7, _waited),
        ("att", 3, lambda job: str(job.get("attempt", ""))),
        ("error", 8, lambda job: str(job.get("error") or "")),
    ]
    shown: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = []
    used = 0
    for column in columns:
        if used + column[1] + 2 > width and shown:
            continue
        shown.append(column)
        used += column[1] + 2
    table = Table(box=None, pad_edge=False, expand=False, width=width)
    for name, least, _ in shown:
        table.add_column(name, min_width=least, no_wrap=True, overflow="ellipsis",
                         ratio=1 if name == "error" else None,
                         max_width=16 if name == "kind" else None,
                         justify="right" if name in ("waited", "att") else "left")
    for job in jobs:
        table.add_row(*(cell(job) for _, _, cell in shown))
    return table


def _short_time(stamp: Any) -> str:
    """``MM-DD HH:MM:SS`` of an RFC 3339 time."""
    return str(stamp or "")[5:19].replace("T", " ")


def _waited(job: dict[str, Any]) -> str:
    """Queue wait (enqueued → started), where both are known."""
    from datetime import datetime

    try:
        started = datetime.fromisoformat(str(job["started_at"]))
        enqueued = datetime.fromisoformat(str(job["enqueued_at"]))
    except (KeyError, TypeError, ValueError):
        return ""
    return f"{(started - enqueued).total_seconds():.1f} s"


@_friendly
def jobs_result(job_id: JobId, api_url: ApiUrl = None, key: ApiKey = None) -> None:
    """Print a finished job's result (as JSON); exit 1 when it failed, was cancelled or
    expired, 3 while it is not finished."""
    with _client(api_url, key) as client:
        answer = client.result(job_id)
    if "result" not in answer:
        _fail(f"job {job_id} is {answer.get('status')}: no result yet", 3)
    Console(highlight=False, soft_wrap=True).print_json(json.dumps(answer["result"]))


@_friendly
def jobs_cancel(job_id: JobId, api_url: ApiUrl = None, key: ApiKey = None) -> None:
    """Cancel a job: at once when it has not started, cooperatively when it runs."""
    with _client(api_url, key, announce=True) as client:
        answer = client.cancel(job_id)
    pending = " (the handler was asked to stop)" if answer.get("cancel_requested") else ""
    Console(highlight=False, soft_wrap=True).print(
        f"job {job_id}  {answer.get('status')}{pending}")


# --- policy -----------------------------------------------------------------------------


@_friendly
def show_policy() -> None:
    """Print the numbers that follow from the configuration, next to the live ones:
    capacity, mean service time, μ, bounds, caps, quotas, the ageing guarantee."""
    from jobs.cli.policy import print_policy

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:  # piped or captured: room for the whole table
        console = Console(highlight=False, soft_wrap=True, width=max(console.width, 132))
    print_policy(load_settings(), console)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        Console(highlight=False).print(f"tierq {version('tierq')}")
        raise typer.Exit()


def _options(
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", show_default=False,
                     help="The data directory of `tierq up` to act on [env TIERQ_DATA_DIR; "
                          "default ./.tierq]."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", show_default=False,
                     help="A TOML configuration file [env TIERQ_CONFIG]."),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of an unexpected error.")
    ] = False,
    _version_: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True,
                     help="Print the version and exit."),
    ] = None,
) -> None:
    """tierq: a durable, tiered job scheduler for expensive (GPU) work."""
    if debug:
        _DEBUG["on"] = True
    # Flags win over the environment; set there, they reach every process a command starts.
    if data_dir is not None:
        os.environ["TIERQ_DATA_DIR"] = str(data_dir.resolve())
    if config is not None:
        os.environ["TIERQ_CONFIG"] = str(config.resolve())


def build_app() -> typer.Typer:
    """The command tree (``main`` runs it; tests introspect it)."""
    app = typer.Typer(
        name="tierq",
        help="tierq: a durable, tiered job scheduler for expensive (GPU) work.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
    )
    app.callback()(_options)
    for command in (up, api, dispatcher, worker, flower, migrate, submit, upload, status,
                    repair):
        app.command()(command)
    app.command("policy")(show_policy)
    tenants = typer.Typer(help="Manage tenants (directly in the database).", no_args_is_help=True)
    tenants.command("create")(tenants_create)
    tenants.command("list")(tenants_list)
    tenants.command("update")(tenants_update)
    tenants.command("rotate-key")(tenants_rotate_key)
    app.add_typer(tenants, name="tenants")
    jobs = typer.Typer(help="Look at and cancel jobs (over the API, with a tenant key).",
                       no_args_is_help=True)
    jobs.command("list")(jobs_list)
    jobs.command("get")(jobs_get)
    jobs.command("result")(jobs_result)
    jobs.command("cancel")(jobs_cancel)
    app.add_typer(jobs, name="jobs")
    from jobs.cli.batches import batch_app  # imports this module: built once it is loaded
    from jobs.cli.simulate import simulate

    app.add_typer(batch_app(), name="batch")
    app.command("simulate")(simulate)
    return app


def serve(settings: Settings) -> None:
    """Run the dispatcher until SIGTERM or SIGINT; a leader resigns on the way out, so a
    standby takes over without waiting out the lock's TTL."""
    import signal
    import threading

    import redis

    from jobs.dispatch.dispatcher import Dispatcher
    from jobs.dispatch.leadership import Leadership
    from jobs.dispatch.loop import run_forever
    from jobs.process.runtime import Runtime
    from workers.publisher import CeleryPublisher  # the publishing adapter: Celery stays there

    runtime = Runtime.from_settings(settings)
    publisher = CeleryPublisher(settings)
    leadership = Leadership(runtime.index, ttl_s=runtime.policy.leader_ttl_s)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logger = logging.getLogger("tierq.dispatcher")
    logger.info("dispatcher.started", extra={"owner": leadership.owner})
    try:
        run_forever(Dispatcher(runtime, publisher), stop, leadership)
    finally:
        try:
            leadership.resign(runtime.clock())
        except redis.RedisError:
            logger.warning("dispatcher.resign_failed", exc_info=True)
        publisher.close()
        runtime.close()
        logger.info("dispatcher.stopped")


def main() -> None:
    build_app()(prog_name="tierq")


if __name__ == "__main__":
    main()

