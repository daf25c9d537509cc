"""The end-to-end bench's table: each figure for tierq and bare Celery, their ratio, the target."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from e2e import Samples

PROCESSES = ("api", "dispatcher", "worker", "postgres", "redis-server")


@dataclass(frozen=True, kw_only=True)
class Row:
    label: str
    tierq: float | None
    celery: float | None
    fmt: str = "{:,.1f}"
    target: str = ""
    # Whether the target is met, given (tierq, Celery); None: no target.
    met: Callable[[float, float | None], bool] | None = None
    ratio: bool = True


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _ratio_met(limit: float, at_least: bool) -> Callable[[float, float | None], bool]:
    def met(ours: float, theirs: float | None) -> bool:
        if not theirs:
            return False
        return ours / theirs >= limit if at_least else ours / theirs <= limit

    return met


def _at_most(limit: float) -> Callable[[float, float | None], bool]:
    return lambda ours, _: ours <= limit


def rows(s: Samples) -> list[Row]:
    def both(name: str) -> tuple[float | None, float | None]:
        return s.median("tierq", name), s.median("celery", name)

    def ms(side: str, name: str, p: int) -> float | None:
        value = s.percentile(side, name, p)
        return None if value is None else 1000 * value

    out = [
        Row(label="1 end to end, no-op (jobs/s)", tierq=both("e2e_per_s")[0],
            celery=both("e2e_per_s")[1], fmt="{:,.0f}", target="≥ 0.5×",
            met=_ratio_met(0.5, at_least=True)),
        Row(label="2 idle submit → start p50 (ms)", tierq=ms("tierq", "start_latency", 50),
            celery=ms("celery", "start_latency", 50), fmt="{:.1f}", target="≤ 3×",
            met=_ratio_met(3.0, at_least=False)),
        Row(label="2 idle submit → start p99 (ms)", tierq=ms("tierq", "start_latency", 99),
            celery=ms("celery", "start_latency", 99), fmt="{:.1f}"),
        Row(label="3 submit alone (jobs/s)", tierq=both("submit_per_s")[0],
            celery=both("submit_per_s")[1], fmt="{:,.0f}", target="≥ 0.5×",
            met=_ratio_met(0.5, at_least=True)),
        Row(label="3   paced at ½ of that (jobs/s)", tierq=both("paced_per_s")[0],
            celery=both("paced_per_s")[1], fmt="{:,.0f}"),
        Row(label="3   submit latency p50 (ms)", tierq=ms("tierq", "paced_latency", 50),
            celery=ms("celery", "paced_latency", 50), fmt="{:.2f}"),
        Row(label="3   submit latency p99 (ms)", tierq=ms("tierq", "paced_latency", 99),
            celery=ms("celery", "paced_latency", 99), fmt="{:.2f}"),
        Row(label="4 SQL transactions/job, end to end", tierq=both("sql_per_job")[0],
            celery=0.0, fmt="{:.2f}", target="≤ 4", met=_at_most(4), ratio=False),
        Row(label="4   of which at submit (API alone)", tierq=both("submit_sql_per_job")[0],
            celery=0.0, fmt="{:.2f}", ratio=False),
        Row(label="5 Redis commands/job (Lua's included)", tierq=both("redis_per_job")[0],
            celery=both("redis_per_job")[1], fmt="{:.1f}"),
        Row(label="5   at submit alone", tierq=both("submit_redis_per_job")[0],
            celery=both("submit_redis_per_job")[1], fmt="{:.1f}"),
        Row(label="5   sent by clients (not Lua)", tierq=both("client_commands_per_job")[0],
            celery=both("client_commands_per_job")[1], fmt="{:.1f}"),
        Row(label="5   round trips (pipelines merged, ≈)", tierq=both("round_trips_per_job")[0],
            celery=both("round_trips_per_job")[1], fmt="{:.1f}", target="≤ 10",
            met=_at_most(10)),
    ]
    out += _process_rows(s)
    queued = both("queued_bytes")
    out.append(Row(label="7 Redis bytes per queued job", tierq=queued[0], celery=queued[1],
                   fmt="{:,.0f}", target="≤ 250", met=_at_most(250)))
    return out


def _process_rows(s: Samples) -> list[Row]:
    out: list[Row] = []
    totals = {side: 0.0 for side in ("tierq", "celery")}
    for process in PROCESSES:
        tierq, celery = s.median("tierq", f"cpu:{process}"), s.median("celery", f"cpu:{process}")
        totals["tierq"] += tierq or 0.0
        totals["celery"] += celery or 0.0
        out.append(Row(label=f"6 CPU ms/job: {process}", tierq=tierq, celery=celery,
                       fmt="{:.2f}", ratio=False))
    out.append(Row(label="6 CPU ms/job: total", tierq=totals["tierq"], celery=totals["celery"],
                   fmt="{:.2f}"))
    for process in ("api", "dispatcher", "worker"):
        out.append(Row(label=f"6 RSS MiB at end: {process}", tierq=s.median("tierq",
                       f"rss:{process}"), celery=s.median("celery", f"rss:{process}"),
                       fmt="{:.0f}", ratio=False))
    return out


def trips_caption(s: Samples) -> str:
    """Round trips per job by the process that sent them, for each side."""
    shown = []
    for side, title in (("tierq", "tierq"), ("celery", "Celery")):
        parts = sorted((name.removeprefix("trips:"), s.median(side, name))
                       for (who, name) in s.values if who == side and name.startswith("trips:"))
        text = ", ".join(f"{name} {value:.1f}" for name, value in parts if value)
        if text:
            shown.append(f"{title}: {text}")
    return f"Round trips/job by client, {'; '.join(shown)}." if shown else ""


def report(s: Samples, args: argparse.Namespace, *, elapsed_s: float) -> Table:
    table = Table(
        title=f"End to end: tierq beside bare Celery ({args.jobs:,} jobs, {args.clients} "
              f"client threads, 4 worker threads, {args.reps} reps)",
        caption=" ".join(part for part in (
            f"{os.cpu_count()} CPU cores; {elapsed_s:.0f} s in all. Rates and costs: median "
            "of reps; latency percentiles: all reps' samples. tierq: API + dispatcher + "
            "worker on PostgreSQL and Redis, echo jobs. Celery: apply_async of a no-op task, "
            "Redis broker and result backend. '-': not applicable or not measured.",
            trips_caption(s),
            f"7: {args.queued:,} jobs for {args.tenants:,} tenants.",
        ) if part),
    )
    for column in ("figure", "tierq", "bare Celery", "tierq / Celery", "target", "met?"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for row in rows(s):
        ratio = "-"
        if row.ratio and row.tierq is not None and row.celery:
            ratio = f"{row.tierq / row.celery:.2f}×"
        met = ""
        if row.met is not None:
            met = "-" if row.tierq is None else ("yes" if row.met(row.tierq, row.celery)
                                                  else "[red]no[/red]")
        table.add_row(row.label, _cell(row.tierq, row.fmt), _cell(row.celery, row.fmt),
                      ratio, row.target, met)
    return table
