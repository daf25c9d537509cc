"""What ``tierq up`` prints once it is up: where things are, next steps that work as printed,
and the figures its slots give each tier."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from jobs.fleet import pool
from jobs.process.program import tierq_command
from jobs.process.settings import Settings

if TYPE_CHECKING:
    from jobs.local.up import UpOptions


def derived_lines(settings: Settings, options: UpOptions) -> list[str]:
    """What each pool's slots give each tier (bound, tenant cap, tenant quota), as
    ``tierq policy`` derives them before any run is measured; a warning where they are 1,
    which refuses a tenant's second job however idle the pool is."""
    lines = []
    for name in options.pools:
        pol = settings.pool_policy(name)
        slots = pol.pool_concurrency or options.concurrency
        figures = pool.figures(pol, capacity=slots, inflight=0)
        of = "" if name == "default" else f" (pool {name})"
        cells = " · ".join(f"{tier} {figures.bounds[tier]}/{figures.caps[tier]}/"
                           f"{figures.quotas[tier]}" for tier in pol.tiers)
        lines.append(f"Bound/cap/quota{of}: {cells}  ({slots} slots, "
                     f"{pol.mean_service_s:g} s a job until measured)")
        tight = [tier for tier in pol.tiers
                 if min(figures.bounds[tier], figures.caps[tier], figures.quotas[tier]) == 1]
        if tight:
            lines.append(f"  warning: a figure of 1 ({', '.join(tight)}) makes a tenant's "
                         "second job wait or be refused however idle the pool is; give more "
                         "slots (--concurrency) or set policy.mean_service_s to your jobs' "
                         "time")
    return lines


def print_banner(console: Console, options: UpOptions, data_dir: Path, url: str,
                  key_file: bool) -> None:
    """What to do next, in commands that work as printed: from this directory they find
    this system through ``up.json``; from elsewhere, the ``--data-dir`` shown does."""
    default = (Path.cwd() / ".tierq").resolve() == data_dir
    program = tierq_command()
    tierq = program if default else f"{program} --data-dir {data_dir}"
    console.print(f"[bold green]tierq is up[/]  data in {data_dir}", highlight=False)
    lines = [
        f"  API        {url}",
        f"  docs       {url}/docs",
        f"  dashboard  {url}/dashboard (paste the admin key, or a tenant's)",
        f"  flower     {tierq} flower --port 5555",
        *([f"  admin      key in {data_dir / 'admin.key'}"] if key_file else []),
        f"Create a tenant:  {tierq} tenants create acme --tier premium",
        "                  export TIERQ_API_KEY=<the key it prints>",
        f"Submit a job:     {tierq} submit echo --payload '{{\"a\": 1}}' --wait",
        "Ctrl-C stops everything.",
    ]
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
