"""How long `tierq simulate` takes: a million jobs of a shipped scenario, per policy.

Each policy replays the same jobs (drawn once, timed apart) on the virtual clock: the
engine (arrivals, workers, heartbeats, retries, the measured mean) and the policy's queue.
For ``tierq`` that is the real path, the in-memory twin of the dispatch index
(``MemoryIndex``: ``admit_new`` per submit, ``dispatch`` under caps, ``release``) and
``jobs.core.policy``; ``strict`` and ``rescore`` are the baselines. The figure that matters: the
million jobs under ``tierq`` in under 30 s on a 2-core machine.

    python bench/simulate.py                        # 1,000,000 jobs of seed, all policies
    python bench/simulate.py --jobs 100000 --scenario noisy --policies tierq
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from jobs.process.settings import load_settings
from jobs.simulate import CONTENDERS, run_policy, traffic_for
from jobs.simulate.scenario import load

BUDGET_S = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--scenario", default="seed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default=",".join(CONTENDERS))
    args = parser.parse_args()
    pol = load_settings().build_policy()
    scenario = load(args.scenario)
    began = time.perf_counter()
    traffic = traffic_for(pol, scenario, jobs=args.jobs, seed=args.seed)
    drawn_s = time.perf_counter() - began
    table = Table(title=f"tierq simulate: {args.scenario}, {len(traffic):,} jobs "
                        f"(drawn in {drawn_s:.1f} s)")
    for column in ("policy", "jobs", "simulated s", "wall s", "target s", "jobs/s",
                   "utilisation"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    console = Console()
    verdict = ""
    for name in args.policies.split(","):
        run = run_policy(pol, scenario, traffic, name)
        target = f"{BUDGET_S:.0f}" if name == "tierq" else "-"
        table.add_row(name, f"{len(traffic):,}", f"{run.horizon_s:,.0f}", f"{run.wall_s:.1f}",
                      target, f"{len(traffic) / run.wall_s:,.0f}", f"{run.utilisation:.1%}")
        if name == "tierq":
            under = "under" if run.wall_s < BUDGET_S else "OVER"
            verdict = (f"tierq: {len(traffic):,} simulated jobs in {run.wall_s:.1f} s, target "
                       f"{BUDGET_S:.0f} s ({under} the budget)")
    console.print(table)
    if verdict:
        console.print(verdict)


if __name__ == "__main__":
    main()
