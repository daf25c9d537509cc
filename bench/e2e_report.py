"""The end-to-end bench's tables: one row per system, tierq's targets, then every figure.

1. the systems side by side: the headline figures, medians of the reps, throughput also as a
   multiple of bare Celery's;
2. tierq's targets, each with what was measured and whether it was met;
3. the details: every figure of every phase for the three systems, and tierq's ratios.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table

if TYPE_CHECKING:
    from e2e import Samples

SYSTEMS = {"tierq": "tierq", "celery": "bare Celery", "procrastinate": "procrastinate"}
PROCESSES = ("client", "api", "dispatcher", "worker", "postgres", "redis-server")


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _ms(s: Samples, side: str, name: str, p: int) -> float | None:
    value = s.percentile(side, name, p)
    return None if value is None else 1000 * value


def cpu_total(s: Samples, side: str) -> float | None:
    """CPU ms per job over all the side's processes, the client's included."""
    parts = [s.median(side, f"cpu:{process}") for process in PROCESSES]
    known = [part for part in parts if part is not None]
    return sum(known) if known else None


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


# -- 1. the systems side by side ----------------------------------------------------------------


def systems_table(s: Samples, args: argparse.Namespace, *, elapsed_s: float) -> Table:
    table = Table(
        title=f"End to end: tierq beside bare Celery and procrastinate ({args.jobs:,} no-op "
              f"jobs, {args.clients} client threads, 4 worker slots, {args.reps} reps)",
        caption=f"{os.cpu_count()} CPU cores; {elapsed_s:.0f} s in all. Medians of reps; "
                "latency percentiles over all reps' samples. CPU: every process of the "
                "system, PostgreSQL backends and Redis included, and the client's submitting "
                "calls. GPU-like: "
                f"{args.hold_jobs} jobs each holding a slot {args.hold_ms} ms, submitted at "
                "once. '-': not applicable.",
    )
    for column in ("system", "no-op end to end (jobs/s)", "× bare Celery",
                   "CPU per job, all processes (ms)", "SQL transactions per job",
                   "Redis round trips per job", "idle submit→start p50 / p99 (ms)",
                   f"GPU-like utilisation ({args.hold_ms} ms jobs)",
                   "end→next start gap p50 (ms)"):
        table.add_column(column, justify="left" if column == "system" else "right",
                         min_width=13 if column == "system" else None)
    celery_rate = s.median("celery", "e2e_per_s")
    for side, title in SYSTEMS.items():
        rate = s.median(side, "e2e_per_s")
        ratio = "-" if rate is None or not celery_rate else f"{rate / celery_rate:.2f}×"
        latency = (f"{_cell(_ms(s, side, 'start_latency', 50), '{:.1f}')} / "
                   f"{_cell(_ms(s, side, 'start_latency', 99), '{:.1f}')}")
        table.add_row(
            title, _cell(rate, "{:,.0f}"), ratio, _cell(cpu_total(s, side), "{:.2f}"),
            _cell(s.median(side, "sql_per_job") if side != "celery" else 0.0, "{:.2f}"),
            _cell(s.median(side, "round_trips_per_job"), "{:.1f}"), latency,
            _percent(s.median(side, "hold:utilisation")),
            _cell(_ms(s, side, "hold:gap", 50), "{:.1f}"))
    return table


# -- 2. tierq's targets ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Target:
    label: str
    measured: str
    met: bool | None  # None: not measured this run


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _at_least(value: float | None, limit: float | None) -> bool | None:
    return None if value is None or limit is None else value >= limit


def targets(s: Samples, args: argparse.Namespace) -> list[Target]:
    tq = lambda name: s.median("tierq", name)  # noqa: E731
    out = [
        Target(label=f"GPU-like utilisation ≥ 95 % ({args.hold_ms} ms jobs)",
               measured=_percent(tq("hold:utilisation")),
               met=_at_least(tq("hold:utilisation"), 0.95)),
    ]
    if args.long_hold_jobs:
        out.append(Target(label=f"GPU-like utilisation ≥ 99 % ({args.long_hold_ms} ms jobs)",
                          measured=_percent(tq("long_hold:utilisation")),
                          met=_at_least(tq("long_hold:utilisation"), 0.99)))
    gap = _ms(s, "tierq", "hold:gap", 50)
    cpu = cpu_total(s, "tierq")
    client = tq("cpu:client")
    rate, celery_rate, pq_rate = (s.median(side, "e2e_per_s") for side in SYSTEMS)
    p50, p99 = _ms(s, "tierq", "start_latency", 50), _ms(s, "tierq", "start_latency", 99)
    sql, queued = tq("sql_per_job"), tq("queued_bytes")
    out += [
        Target(label="end→next start gap p50 ≤ 3 ms", measured=_cell(gap, "{:.1f} ms"),
               met=_at_most(gap, 3)),
        Target(label="CPU per job ≤ 5 ms, all processes",
               measured=f"{_cell(cpu, '{:.2f} ms')} (client {_cell(client, '{:.2f}')})",
               met=_at_most(cpu, 5)),
        Target(label="no-op end to end ≥ procrastinate's",
               measured=f"{_cell(rate, '{:,.0f}')} vs {_cell(pq_rate, '{:,.0f}')} jobs/s",
               met=_at_least(rate, pq_rate)),
        Target(label="no-op end to end ≥ 0.5× bare Celery's",
               measured=("-" if rate is None or not celery_rate
                         else f"{rate / celery_rate:.2f}× ({rate:,.0f} vs {celery_rate:,.0f})"),
               met=_at_least(rate, None if celery_rate is None else 0.5 * celery_rate)),
        Target(label="idle submit→start p50 ≤ 6 ms", measured=_cell(p50, "{:.1f} ms"),
               met=_at_most(p50, 6)),
        Target(label="idle submit→start p99 ≤ 20 ms", measured=_cell(p99, "{:.1f} ms"),
               met=_at_most(p99, 20)),
        Target(label="≤ 3 SQL transactions per job (no-op, end to end)",
               measured=_cell(sql, "{:.2f}"), met=_at_most(sql, 3)),
        Target(label=f"≤ 250 Redis bytes per queued job (at {args.queued:,}; target size 1M)",
               measured=_cell(queued, "{:,.0f} B"), met=_at_most(queued, 250)),
    ]
    return out


def targets_table(s: Samples, args: argparse.Namespace) -> Table:
    table = Table(title="tierq's targets (this run)")
    for column in ("target", "measured", "verdict"):
        table.add_column(column, justify="left" if column == "target" else "right")
    for target in targets(s, args):
        verdict = ("-" if target.met is None
                   else "met" if target.met else "[red]MISSED[/red]")
        table.add_row(target.label, target.measured, verdict)
    return table


# -- 3. the details --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Row:
    label: str
    values: dict[str, float | None]  # by side
    fmt: str = "{:,.1f}"
    ratio: bool = True


def detail_rows(s: Samples, args: argparse.Namespace) -> list[Row]:
    def med(name: str, fmt: str, label: str, ratio: bool = True,
            absent: dict[str, float] | None = None) -> Row:
        values = {side: s.median(side, name) for side in SYSTEMS}
        for side, value in (absent or {}).items():
            values[side] = value if values[side] is None else values[side]
        return Row(label=label, values=values, fmt=fmt, ratio=ratio)

    def pct(name: str, p: int, fmt: str, label: str) -> Row:
        return Row(label=label, values={side: _ms(s, side, name, p) for side in SYSTEMS},
                   fmt=fmt)

    no_sql = {"celery": 0.0}
    out = [
        med("e2e_per_s", "{:,.0f}", "1 end to end, no-op (jobs/s)"),
        pct("start_latency", 50, "{:.1f}", "2 idle submit → start p50 (ms)"),
        pct("start_latency", 99, "{:.1f}", "2 idle submit → start p99 (ms)"),
        med("submit_per_s", "{:,.0f}", "3 submit alone (jobs/s)"),
        med("paced_per_s", "{:,.0f}", "3   paced at ½ of that (jobs/s)"),
        pct("paced_latency", 50, "{:.2f}", "3   submit latency p50 (ms)"),
        pct("paced_latency", 99, "{:.2f}", "3   submit latency p99 (ms)"),
        med("sql_per_job", "{:.2f}", "4 SQL transactions/job, end to end", False, no_sql),
        med("submit_sql_per_job", "{:.2f}", "4   of which at submit (API alone)", False,
            no_sql),
        med("redis_per_job", "{:.1f}", "5 Redis commands/job (Lua's included)"),
        med("submit_redis_per_job", "{:.1f}", "5   at submit alone"),
        med("client_commands_per_job", "{:.1f}", "5   sent by clients (not Lua)"),
        med("round_trips_per_job", "{:.1f}", "5   round trips (pipelines merged, ≈)"),
    ]
    for process in PROCESSES:
        out.append(med(f"cpu:{process}", "{:.2f}", f"6 CPU ms/job: {process}", False))
    out.append(Row(label="6 CPU ms/job: total", values={side: cpu_total(s, side)
                                                        for side in SYSTEMS}, fmt="{:.2f}"))
    for process in ("api", "dispatcher", "worker"):
        out.append(med(f"rss:{process}", "{:.0f}", f"6 RSS MiB at end: {process}", False))
    runs = [("hold", args.hold_jobs, args.hold_ms)]
    if args.long_hold_jobs:
        runs.append(("long_hold", args.long_hold_jobs, args.long_hold_ms))
    for name, jobs, ms in runs:
        what = f"7 GPU-like, {jobs} × {ms} ms:"
        out += [
            med(f"{name}:makespan", "{:.2f}", f"{what} makespan (s)"),
            med(f"{name}:utilisation", "{:.1%}", f"{what} utilisation"),
            pct(f"{name}:gap", 50, "{:.1f}", f"{what} end → next start p50 (ms)"),
            pct(f"{name}:gap", 99, "{:.1f}", f"{what} end → next start p99 (ms)"),
        ]
    out.append(med("queued_bytes", "{:,.0f}", "8 Redis bytes per queued job"))
    return out


def trips_caption(s: Samples) -> str:
    """Round trips per job by the process that sent them, for each side with Redis."""
    shown = []
    for side, title in (("tierq", "tierq"), ("celery", "Celery")):
        parts = sorted((name.removeprefix("trips:"), s.median(side, name))
                       for (who, name) in s.values if who == side and name.startswith("trips:"))
        text = ", ".join(f"{name} {value:.1f}" for name, value in parts if value)
        if text:
            shown.append(f"{title}: {text}")
    return f"Round trips/job by client, {'; '.join(shown)}." if shown else ""


def idle_sql_caption(s: Samples) -> str:
    """The idle systems' own SQL transactions, taken off the waits for the counts."""
    shown = []
    for side in ("tierq", "procrastinate"):
        idle, held = s.median(side, "idle_sql_per_s"), s.median(side, "held_sql_per_s")
        if idle is not None and held is not None:
            shown.append(f"{side} {idle:.1f}/s ({held:.1f}/s held)")
    return (f"Idle SQL transactions taken off the 10 s waits for PostgreSQL's counts: "
            f"{', '.join(shown)}." if shown else "")


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if ours is None or not theirs else f"{ours / theirs:.2f}×"


def details_table(s: Samples, args: argparse.Namespace) -> Table:
    table = Table(
        title="Every figure",
        caption=" ".join(part for part in (
            "tierq: API + dispatcher + worker on PostgreSQL and Redis, echo jobs. Celery: "
            "apply_async of a no-op task, Redis broker and result backend. procrastinate: "
            "defer of a no-op task, one worker (concurrency 4), PostgreSQL only. "
            "'-': not applicable or not measured.",
            trips_caption(s),
            idle_sql_caption(s),
            f"8: {args.queued:,} jobs for {args.tenants:,} tenants.",
        ) if part),
    )
    for column in ("figure", *SYSTEMS.values(), "tierq / Celery", "tierq / procrastinate"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for row in detail_rows(s, args):
        tq = row.values["tierq"]
        ratios = ((_ratio(tq, row.values["celery"]), _ratio(tq, row.values["procrastinate"]))
                  if row.ratio else ("-", "-"))
        table.add_row(row.label, *(_cell(row.values[side], row.fmt) for side in SYSTEMS),
                      *ratios)
    return table


def report(s: Samples, args: argparse.Namespace, *, elapsed_s: float) -> Group:
    return Group(systems_table(s, args, elapsed_s=elapsed_s), targets_table(s, args),
                 details_table(s, args))
