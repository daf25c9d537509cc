"""``tierq simulate``: a scenario's traffic under the configured policy, next to the
baselines, on a virtual clock. Reads the policy as ``tierq policy`` does; needs no running
system."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from jobs.cli.common import fail, friendly, target
from jobs.process.settings import load_settings

DEFAULT_POLICIES = "strict,rescore,tierq"


@friendly
def simulate(
    scenario: Annotated[
        str, typer.Option("--scenario", help="A shipped scenario (seed, noisy, diurnal, batch, "
                          "mixed, pools, packing) or the path of a scenario TOML file.")
    ] = "seed",
    config: Annotated[
        Path | None,
        typer.Option("--config", show_default=False,
                     help="The TOML configuration whose policy is simulated (env TIERQ_CONFIG)."),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", min=1, show_default=False,
                                 help="Jobs to simulate (default: the scenario's).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random draws.")] = 1,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", show_default=False,
                     help="Write a PNG: wait CDF per tier and policy, queue depth and "
                          "utilisation over time (needs matplotlib: the plot extra)."),
    ] = None,
    policies: Annotated[
        str, typer.Option("--policies", help="The policies to compare, comma-separated.")
    ] = DEFAULT_POLICIES,
    packing: Annotated[
        list[str] | None,
        typer.Option("--packing", metavar="KIND=MAX", show_default=False,
                     help="At most MAX items of KIND per run (1: KIND does not pack); a "
                          "run takes a + b × items seconds, a and b the run_time the scenario "
                          "gives KIND. Repeat for more kinds."),
    ] = None,
) -> None:
    """Simulate a scenario under the configured policy and the baselines (strict priority,
    a rescored heap): per tier, served, refused, waits and overtaking; per tenant, peak
    concurrency; the pool's utilisation; with pools, each pool's jobs, waits and use; with
    kinds that pack, each one's runs and items per run."""
    from jobs import simulate as sim
    from jobs.simulate import plot as plotting
    from jobs.simulate import scenario as scenarios
    from jobs.simulate import table
    from jobs.simulate.report import busiest_tenants, told_floor_s

    if plot is not None and not plotting.available():
        fail(plotting.MISSING, 2)
    names = [name.strip() for name in policies.split(",") if name.strip()]
    unknown = [name for name in names if name not in sim.CONTENDERS]
    if unknown or not names:
        fail(f"--policies: choose from {', '.join(sim.CONTENDERS)}", 2)
    settings = load_settings(config=config) if config is not None else load_settings()
    pol = settings.build_policy()
    chosen = scenarios.load(scenario)
    if packing:
        chosen = chosen.with_packing(_max_items(packing))
    count = jobs or chosen.jobs
    target(f"scenario {chosen.name}: {count:,} jobs, seed {seed}, policies {', '.join(names)}")
    comparison = sim.compare(pol, chosen, jobs=count, seed=seed, policies=names,
                             configured=settings.pool_set())
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:  # piped or captured: room for the whole table
        console = Console(highlight=False, soft_wrap=True, width=max(console.width, 200))
    horizon = comparison.runs[0].horizon_s
    console.print(table.tier_table(
        comparison.reports,
        f"{chosen.name}: {count:,} jobs over {horizon:,.0f} simulated seconds"))
    told = table.told_table(comparison.reports, told_floor_s(chosen))
    if told is not None:
        console.print(told)
    runs = table.runs_table(comparison.reports)
    if runs is not None:
        console.print(runs)
    console.print(table.tenant_table(busiest_tenants(comparison.runs, comparison.traffic)))
    pooled = len(chosen.pools) > 1
    console.print(table.pool_table(comparison.reports, "all pools" if pooled else "pool"))
    if pooled:
        console.print(table.pools_table(comparison.reports, chosen))
    for line in table.guarantee_lines(pol, comparison.reports):
        console.print(line)
    if plot is not None:
        plotting.draw(pol, comparison, plot)
        console.print(f"wrote {plot}")


def _max_items(given: list[str]) -> dict[str, int]:
    """``--packing KIND=MAX`` options, by kind."""
    out = {}
    for each in given:
        kind, _, number = each.rpartition("=")
        if not kind or not number.isdigit():
            fail(f"--packing {each}: KIND=MAX, MAX a whole number of items per run", 2)
        out[kind] = int(number)
    return out
