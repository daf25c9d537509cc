"""Packing bench: the same work with packing off and on, side by side, through real processes.

tierq's API and dispatcher on PostgreSQL (a throwaway database) and a Redis of the bench's
own; one threads worker of 4 slots per mode, whose configuration sets the packing
(``[kinds."<kind>"] max_items_per_run = 1`` turns it off; on, the handler's own):

1. **evaluation**: a batch (one NDJSON ``POST /v1/batches``) of ``--items`` ``eval.similarity``
   items of one short sentence pair each (every sentence different), on the real model
   (loaded before the worker registers its slots), while a premium tenant submits one
   ``eval.similarity`` job every ``--premium-every`` s. Targets: the batch's items per second
   on ≥ 3 × off; the premium jobs' p95 wait (``started_at − enqueued_at``) on ≤ the larger
   of off × 1.10 and off + 50 ms. The batch's tenant holds at most ``--bulk-share`` of the
   slots (a run counts one), as a deployment leaves room for its premium tier; torch runs
   ``--torch-threads`` threads in the worker, in both modes.
2. **GPU-like**: a batch of ``--gpu-items`` items of ``bench.pack`` (``packing_handlers``),
   whose run of n items sleeps ``a + b × n`` s, in runs of up to 32. Targets with packing
   on: CPU of tierq's API, dispatcher and worker per item ≤ 1.5 ms (a sleeping handler
   spends none: all of it is the scheduler's); SQL transactions per item ≤ 0.2
   (``pg_stat_database``, less the bench's own reads and the idle system's trickle).
   Off: ``--gpu-off-items`` items (each one a run of its own: at 52 ms a run, a
   smaller count keeps the bench short; the figures are per item).

About 4 minutes on 2 cores (``--quick``: about 2).

    .venv/bin/python bench/packing.py [--items 2000] [--gpu-items 4000] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from e2e_meters import IDLE_FLUSH_S, CpuMeter, SqlMeter
from e2e_stack import bench_redis
from packing_handlers import FIXED_ENV, KIND, PER_ITEM_ENV
from packing_phases import (
    EVAL,
    EvalFigures,
    GpuFigures,
    Rows,
    eval_payloads,
    evaluation,
    gpu_like,
    percentile,
    warm,
)
from packing_stack import REPO, SLOTS, Stack, stack
from rich.console import Console
from rich.table import Table
from submit import postgres_admin_url, throwaway_database

MODES = {"off": 1, "on": None}  # max_items_per_run in the configuration (None: the handler's)
THROUGHPUT_TARGET = 3.0
WAIT_RATIO, WAIT_FLOOR_S = 1.10, 0.050
CPU_TARGET_MS, SQL_TARGET = 1.5, 0.2
CONTROL_PLANE = ("api", "dispatcher", "worker")


def kinds(kind: str, mode: str) -> dict[str, int]:
    items = MODES[mode]
    return {} if items is None else {kind: items}


def run_evaluation(system: Stack, rows: Rows, cpu: CpuMeter, args: argparse.Namespace,
                   console: Console) -> dict[str, EvalFigures]:
    figures = {}
    for mode in MODES:
        with console.status(f"evaluation, packing {mode}: starting a worker, loading the "
                            "model") as status, system.worker(
                f"eval-{mode}", kinds(EVAL, mode), eager=True, threads=args.torch_threads):
            warm(system, rows, EVAL, eval_payloads(4 * SLOTS, seed=args.seed + 99))
            status.update(f"evaluation, packing {mode}: {args.items:,} items")
            figures[mode] = evaluation(system, rows, cpu, items=args.items,
                                       premium_every=args.premium_every, seed=args.seed)
        console.log(f"evaluation, packing {mode}: {figures[mode].items_per_s:.1f} items/s "
                    f"({figures[mode].reindexed} items waited for the reconciler), premium "
                    f"p95 wait {1000 * figures[mode].wait_p(95):.0f} ms")
    return figures


def run_gpu_like(system: Stack, rows: Rows, sql: SqlMeter, cpu: CpuMeter,
                 args: argparse.Namespace, console: Console) -> dict[str, GpuFigures]:
    figures = {}
    for mode in MODES:
        items = args.gpu_items if mode == "on" else args.gpu_off_items
        with console.status(f"GPU-like, packing {mode}: {items:,} items (and "
                            f"{IDLE_FLUSH_S:.0f} s waits for PostgreSQL's counts)"):
            with system.worker(f"gpu-{mode}", kinds(KIND, mode), eager=False,
                               threads=args.torch_threads):
                warm(system, rows, KIND, [{"i": i} for i in range(4 * SLOTS)])
                quiet = time.monotonic()
                if not sql.idle_per_s:
                    idle_rate(sql, quiet)
                    quiet = time.monotonic()
                figures[mode] = gpu_like(system, rows, sql, cpu, items=items,
                                         quiet_since=quiet)
        console.log(f"GPU-like, packing {mode}: "
                    f"{figures[mode].cpu_ms_per_item(*CONTROL_PLANE):.2f} CPU ms/item, "
                    f"{figures[mode].sql / items:.3f} SQL transactions/item")
    return figures


def model_ceiling(args: argparse.Namespace, console: Console) -> dict[str, float]:
    """The handler alone, one item per call and in full runs (``packing_model``), in a
    process of its own with the workers' torch threads, nothing else of the bench running."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.torch_threads),
           "MKL_NUM_THREADS": str(args.torch_threads),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p)}
    with console.status("the handler alone, without tierq"):
        done = subprocess.run([sys.executable, str(REPO / "bench" / "packing_model.py"),
                               "--items", str(args.model_items)], env=env, check=True,
                              capture_output=True, text=True, timeout=300)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def idle_rate(sql: SqlMeter, quiet_since: float) -> None:
    """The idle system's own transactions per second (its loops: leases, measures), over
    one flush interval once what came before is counted."""
    before = sql.flushed(quiet_since)
    started = time.monotonic()
    time.sleep(IDLE_FLUSH_S)
    sql.idle_per_s = (sql.transactions() - before) / (time.monotonic() - started)


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    os.environ.update({FIXED_ENV: str(args.fixed_s), PER_ITEM_ENV: str(args.per_item_s)})
    with contextlib.ExitStack() as stack_:
        admin_url = stack_.enter_context(postgres_admin_url())
        database_url = stack_.enter_context(throwaway_database(admin_url))
        workdir = Path(stack_.enter_context(tempfile.TemporaryDirectory(prefix="tierq-pack-")))
        redis_at = stack_.enter_context(bench_redis(workdir))
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        stack_.callback(admin.dispose)
        engine = sa.create_engine(database_url, isolation_level="AUTOCOMMIT", pool_size=1)
        stack_.callback(engine.dispose)
        rows = Rows(engine)
        sql = SqlMeter(admin=admin, database=sa.make_url(database_url).database or "")
        with console.status("starting tierq (API, dispatcher)"):
            system = stack_.enter_context(stack(database_url, redis_at.url, workdir,
                                                bulk_share=args.bulk_share))
        with engine.connect() as conn:
            own = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        cpu = CpuMeter({
            **{name: _process(system, name) for name in CONTROL_PLANE},
            "postgres": lambda: [pid for pid in sql.backend_pids() if pid != own],
            "redis-server": lambda: [redis_at.pid] if redis_at.pid else [],
        })
        results: dict[str, Any] = {"load": [os.getloadavg()[0]]}
        if args.items:
            results["eval"] = run_evaluation(system, rows, cpu, args, console)
            if args.model_items:
                results["ceiling"] = model_ceiling(args, console)
        if args.gpu_items:
            results["gpu"] = run_gpu_like(system, rows, sql, cpu, args, console)
        results["idle_sql_per_s"] = sql.idle_per_s
        results["load"].append(os.getloadavg()[0])
    return results


def _process(system: Stack, name: str) -> Callable[[], list[int]]:
    return lambda: [system.processes[name].pid] if name in system.processes else []


# -- the table ---------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "[green]PASS[/green]" if ok else "[red]FAIL[/red]"


def ratio(on: float, off: float) -> str:
    return f"{on / off:.2f}×" if off else "-"


def table(results: dict[str, Any], args: argparse.Namespace, elapsed_s: float) -> Table:
    load = ", ".join(f"{x:.1f}" for x in results["load"])
    out = Table(title=f"packing off vs on: one worker of {SLOTS} slots, {os.cpu_count()} CPUs "
                      f"(load average at start, end: {load}), PostgreSQL + Redis "
                      f"({elapsed_s:.0f} s)")
    out.add_column("figure")
    for name in ("off", "on", "on / off", "target", "verdict"):
        out.add_column(name, justify="right")
    if "eval" in results:
        _eval_rows(out, results["eval"], results.get("ceiling"), args)
    if "gpu" in results:
        _gpu_rows(out, results["gpu"], results["idle_sql_per_s"], args)
    return out


def _eval_rows(out: Table, ev: dict[str, EvalFigures], ceiling: dict[str, float] | None,
               args: argparse.Namespace) -> None:
    off, on = ev["off"], ev["on"]
    speedup = on.items_per_s / off.items_per_s
    out.add_row(f"1. eval.similarity items/s ({args.items:,} items, one batch; torch "
                f"{args.torch_threads} thread(s), batch tenant on {args.bulk_share:g} of the "
                f"slots)", f"{off.items_per_s:.1f}", f"{on.items_per_s:.1f}", f"{speedup:.2f}×",
                f"≥ {THROUGHPUT_TARGET:g}×", verdict(speedup >= THROUGHPUT_TARGET))
    out.add_row("   items/s leaving out the items that waited for the reconciler "
                f"(off / on: {off.reindexed} / {on.reindexed})", f"{off.items_per_s_others:.1f}",
                f"{on.items_per_s_others:.1f}",
                ratio(on.items_per_s_others, off.items_per_s_others), "", "")
    if ceiling:
        alone, packed = ceiling["alone_per_s"], ceiling["packed_per_s"]
        out.add_row(f"   the handler alone, no tierq ({args.model_items} items each way, one "
                    "after another): items/s one per call / in runs of 64: the model's own "
                    "gain", f"{alone:.1f}", f"{packed:.1f}", f"{packed / alone:.2f}×", "", "")
    out.add_row("   worker CPU ms/item (the model's included)", f"{off.worker_cpu_ms:.1f}",
                f"{on.worker_cpu_ms:.1f}", ratio(on.worker_cpu_ms, off.worker_cpu_ms), "", "")
    p95_off, p95_on = off.wait_p(95), on.wait_p(95)
    by_ratio, by_floor = p95_off * WAIT_RATIO, p95_off + WAIT_FLOOR_S
    bound, which = ((by_ratio, f"off × {WAIT_RATIO:.2f}") if by_ratio >= by_floor
                    else (by_floor, f"off + {1000 * WAIT_FLOOR_S:.0f} ms floor"))
    out.add_row(f"   premium single jobs' wait p95, ms (one every {args.premium_every:g} s; "
                f"n = {len(off.waits_s)} / {len(on.waits_s)})", f"{1000 * p95_off:.0f}",
                f"{1000 * p95_on:.0f}", ratio(p95_on, p95_off),
                f"≤ {1000 * bound:.0f} ({which})",
                verdict(not math.isnan(p95_on) and p95_on <= bound))
    out.add_row("   premium wait p50, ms", f"{1000 * off.wait_p(50):.0f}",
                f"{1000 * on.wait_p(50):.0f}", ratio(on.wait_p(50), off.wait_p(50)), "", "")
    run_off, run_on = percentile(off.runs_s, 95), percentile(on.runs_s, 95)
    out.add_row("   premium jobs' run p95 (started → finished), ms", f"{1000 * run_off:.0f}",
                f"{1000 * run_on:.0f}", ratio(run_on, run_off), "", "")
    out.add_row("   mean items per run: batch / premium jobs",
                f"{off.run_items:.1f} / {off.premium_run_items:.1f}",
                f"{on.run_items:.1f} / {on.premium_run_items:.1f}", "", "", "")


def _gpu_rows(out: Table, gpu: dict[str, GpuFigures], idle: float,
              args: argparse.Namespace) -> None:
    off, on = gpu["off"], gpu["on"]
    cpu_off, cpu_on = (f.cpu_ms_per_item(*CONTROL_PLANE) for f in (off, on))
    out.add_row(f"2. GPU-like control-plane CPU ms/item (API + dispatcher + worker; runs of "
                f"{args.fixed_s:g} + {args.per_item_s:g} × n s, asleep; {off.items:,} / "
                f"{on.items:,} items)", f"{cpu_off:.2f}", f"{cpu_on:.2f}",
                ratio(cpu_on, cpu_off), f"on ≤ {CPU_TARGET_MS:g}",
                verdict(cpu_on <= CPU_TARGET_MS))
    for name in CONTROL_PLANE:
        out.add_row(f"   {name}", f"{off.cpu_ms_per_item(name):.2f}",
                    f"{on.cpu_ms_per_item(name):.2f}",
                    ratio(on.cpu_ms_per_item(name), off.cpu_ms_per_item(name)), "", "")
    out.add_row("   PostgreSQL backends + redis-server (not in the target)",
                f"{off.cpu_ms_per_item('postgres', 'redis-server'):.2f}",
                f"{on.cpu_ms_per_item('postgres', 'redis-server'):.2f}", "", "", "")
    sql_off, sql_on = off.sql / off.items, on.sql / on.items
    out.add_row(f"   SQL transactions/item (pg_stat_database; idle {idle:.1f}/s taken off)",
                f"{sql_off:.3f}", f"{sql_on:.3f}", ratio(sql_on, sql_off),
                f"on ≤ {SQL_TARGET:g}", verdict(sql_on <= SQL_TARGET))
    raw_off, raw_on = ((f.sql + f.trickle) / f.items for f in (off, on))
    out.add_row("   the same with the idle trickle left in", f"{raw_off:.3f}", f"{raw_on:.3f}",
                ratio(raw_on, raw_off), "", "")
    out.add_row("   items/s; mean items per run",
                f"{off.items / off.wall_s:.0f}; {off.run_items:.1f}",
                f"{on.items / on.wall_s:.0f}; {on.run_items:.1f}",
                ratio(on.items / on.wall_s, off.items / off.wall_s), "", "")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=None,
                        help="eval.similarity items of the batch (2000; --quick 600; 0: skip)")
    parser.add_argument("--gpu-items", type=int, default=None,
                        help="bench.pack items, packing on (4000; --quick 1500; 0: skip)")
    parser.add_argument("--gpu-off-items", type=int, default=None,
                        help="bench.pack items, packing off (1000; --quick 400)")
    parser.add_argument("--model-items", type=int, default=None,
                        help="items the handler runs alone each way, without tierq (160; "
                             "--quick 64; 0: skip)")
    parser.add_argument("--quick", action="store_true", help="smaller counts")
    parser.add_argument("--premium-every", type=float, default=0.5,
                        help="seconds between the premium tenant's single jobs (0.5)")
    parser.add_argument("--bulk-share", type=float, default=0.75,
                        help="the batch tier's tenant_share: of the 4 slots, 3 (0.75)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="OMP_NUM_THREADS of the worker, both modes (1)")
    parser.add_argument("--fixed-s", type=float, default=0.05, help="a of a + b × n (0.05)")
    parser.add_argument("--per-item-s", type=float, default=0.002, help="b (0.002)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    defaults = {"items": (2000, 600), "gpu_items": (4000, 1500), "gpu_off_items": (1000, 400),
                "model_items": (160, 64)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


@contextlib.contextmanager
def interrupted_on_sigterm() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so that every process the bench started is stopped."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(width=160)
    started = time.monotonic()
    with interrupted_on_sigterm():
        results = run(args, console)
    console.print(table(results, args, time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
