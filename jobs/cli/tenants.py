"""``tierq tenants``: create, list, update tenants and rotate their keys, directly in the
database, since there is no tenant key yet to go through the API with."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from jobs.cli.common import fail, friendly, open_runtime
from jobs.core.policy import (
    MAX_TENANT_BURST,
    MAX_TENANT_CAP,
    MAX_TENANT_QUEUED,
    MAX_TENANT_RATE_PER_S,
)

if TYPE_CHECKING:
    from jobs.process.runtime import Runtime


def _tierq() -> str:
    """How to call tierq for the same system: with the data directory given, if one was."""
    from jobs.process.program import tierq_command

    program = tierq_command()
    data_dir = os.environ.get("TIERQ_DATA_DIR")
    if data_dir and Path(data_dir).resolve() != (Path.cwd() / ".tierq").resolve():
        return f"{program} --data-dir {data_dir}"
    return program


@friendly
def tenants_create(
    name: Annotated[str, typer.Argument(help="Unique tenant name.")],
    tier: Annotated[str, typer.Option(help="The tenant's tier (see `tierq policy`).")],
) -> None:
    """Create a tenant in the database and print its API key (shown once)."""
    from sqlalchemy.exc import OperationalError

    from jobs.service.tenants import create_tenant

    runtime = open_runtime(announce=True)
    try:
        tenant, key = create_tenant(runtime, name=name, tier=tier)
    except OperationalError as exc:
        fail(f"database not ready ({exc.orig}): run `tierq migrate` or `tierq up` first", 1)
    finally:
        runtime.close()
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"tenant {tenant.name}  id {tenant.id}  tier {tenant.tier}")
    console.print(f"API key (shown once, store it now): [bold]{key}[/]")
    console.print(f"Use it:  export TIERQ_API_KEY={key}", markup=False)
    console.print(f"         {_tierq()} submit echo --payload '{{\"a\": 1}}' --wait", markup=False)


@friendly
def tenants_list() -> None:
    """List the tenants."""
    from datetime import UTC, datetime

    from jobs.service.tenants import list_tenants

    runtime = open_runtime(announce=False)
    try:
        tenants = list_tenants(runtime)
    finally:
        runtime.close()
    table = Table("name", "tier")
    table.add_column("id", no_wrap=True, min_width=36)  # copied from here: never cut or wrapped
    table.add_column("created (UTC)", overflow="fold")
    table.add_column("overrides", overflow="fold")
    for t in tenants:
        overrides = {"cap": t.cap, "max_queued": t.max_queued, "rate_per_s": t.rate_per_s}
        shown = ", ".join(f"{k}={v}" for k, v in overrides.items() if v is not None)
        created = datetime.fromtimestamp(t.created_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(t.name, t.tier, t.id, created, shown or "-")
    console = Console()
    if not console.is_terminal:  # piped: room for every column
        console = Console(width=max(console.width, 160))
    console.print(table)


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


@friendly
def tenants_rotate_key(
    tenant: Annotated[str, typer.Argument(help="The tenant's name or id.")],
) -> None:
    """Give a tenant a new API key and print it; the old key stops working at once."""
    from jobs.service.tenants import rotate_key

    runtime = open_runtime(announce=True)
    try:
        updated, key = rotate_key(runtime, _tenant_ref(runtime, tenant))
    finally:
        runtime.close()
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"tenant {updated.name}  id {updated.id}: the old key no longer works")
    console.print(f"new API key (shown once, store it now): [bold]{key}[/]")


@friendly
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
        fail(f"--rate-per-s must be a number in (0, {MAX_TENANT_RATE_PER_S:g}], not "
             f"{rate_per_s}", 2)
    given: dict[str, Any] = {"cap": cap, "max_queued": max_queued, "rate_per_s": rate_per_s,
                             "rate_burst": rate_burst}
    changes: dict[str, Any] = {k: (UNCHANGED if v is None else v) for k, v in given.items()}
    for name in clear or []:
        if name not in OVERRIDES:
            fail(f"--clear takes one of {', '.join(OVERRIDES)}, not {name!r}", 2)
        changes[name] = None
    runtime = open_runtime(announce=True)
    try:
        updated = update_tenant(runtime, _tenant_ref(runtime, tenant), tier=tier, **changes)
    finally:
        runtime.close()
    overrides = {"cap": updated.cap, "max_queued": updated.max_queued,
                 "rate_per_s": updated.rate_per_s, "rate_burst": updated.rate_burst}
    shown = ", ".join(f"{k}={v}" for k, v in overrides.items() if v is not None) or "none"
    Console(highlight=False, soft_wrap=True).print(
        f"tenant {updated.name}  tier {updated.tier}  overrides: {shown}")


def tenants_app() -> typer.Typer:
    tenants = typer.Typer(help="Manage tenants (directly in the database).", no_args_is_help=True)
    tenants.command("create")(tenants_create)
    tenants.command("list")(tenants_list)
    tenants.command("update")(tenants_update)
    tenants.command("rotate-key")(tenants_rotate_key)
    return tenants
