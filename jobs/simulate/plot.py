"""The comparison as a PNG (matplotlib, the ``plot`` extra): per tier the share of its
admitted jobs started within a wait, per policy; per policy the queue depth of each tier
over time; the pool's utilisation over time (each pool's, with pools)."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.core.policy import Policy, ageing_guarantee_s
from jobs.simulate.report import row_waits

if TYPE_CHECKING:
    from jobs.simulate import Comparison

MISSING = "--plot needs matplotlib: pip install 'tierq[plot]'"
POINTS = 400  # points per curve: enough for the eye, quick for a million jobs
# The baseline that mostly coincides with tierq is dashed, so that both show.
STYLE = {"rescore": "--"}


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _cdf(ax: Any, waits: list[float], admitted: int, top: float, label: str) -> None:
    """Share of the admitted jobs started within x seconds, for x up to ``top`` (jobs that
    never started never count: a starved tier stays low)."""
    if not admitted:
        return
    waits = sorted(waits)
    # Spaced as the symlog axis draws them: linear up to 1 s, geometric above.
    xs = [i / 50 for i in range(51)] + [top ** (k / POINTS) for k in range(1, POINTS + 1)]
    ys = [bisect.bisect_right(waits, x) / admitted for x in xs]
    ax.plot(xs, ys, STYLE.get(label, "-"), label=label)


def _share(busy: int, capacity: int) -> float:
    return busy / capacity if capacity else 0.0


def _smooth(values: list[float], width: int = 5) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - width + 1): i + 1]
        out.append(sum(window) / len(window))
    return out


def draw(pol: Policy, comparison: Comparison, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traffic, runs = comparison.traffic, comparison.runs
    tiers = traffic.tiers
    per_run = [(run, row_waits(run, traffic)) for run in runs]
    names = [row.name for row in per_run[0][1]]
    cols = max(len(names), len(runs))
    fig, axes = plt.subplots(3, cols, figsize=(4.4 * cols, 11), squeeze=False)
    for r, name in enumerate(names):
        ax = axes[0][r]
        top = max([1.0] + [max(rows[r].waits, default=0.0) for _, rows in per_run])
        for run, rows in per_run:
            _cdf(ax, rows[r].waits, rows[r].admitted, top, run.policy)
        tier = pol.tier(name.removesuffix(" batch"))
        guarantee = ageing_guarantee_s(tier, pol.tiers, pol.ageing_rate_s)
        if guarantee > 0:
            ax.axvline(guarantee, linestyle=":", color="grey", label="ageing guarantee")
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(0, top)
        ax.set_ylim(0, 1.02)
        ax.set(title=f"{name}: started within a wait", xlabel="wait (s)",
               ylabel="share of admitted jobs")
        ax.legend(fontsize="small")
    for i, run in enumerate(runs):
        ax = axes[1][i]
        times = [s.at_s for s in run.samples]
        for t, name in enumerate(tiers):
            ax.plot(times, [s.queued[t] for s in run.samples], label=name)
        ax.set(title=f"{run.policy}: queued jobs", xlabel="time (s)", ylabel="queued")
        ax.legend(fontsize="small")
    ax = axes[2][0]
    pooled = len(traffic.pools) > 1
    for run in runs:
        times = [s.at_s for s in run.samples]
        if pooled:  # each pool's own use: one pool's flood is no other's
            for p, pool in enumerate(traffic.pools):
                busy = [_share(*s.pools[p]) for s in run.samples]
                ax.plot(times, _smooth(busy), STYLE.get(run.policy, "-"),
                        label=f"{run.policy}: {pool}")
            continue
        busy = [_share(s.busy, s.capacity) for s in run.samples]
        ax.plot(times, _smooth(busy), STYLE.get(run.policy, "-"), label=run.policy)
    ax.set_ylim(0, 1.05)
    ax.set(title="pool utilisation", xlabel="time (s)", ylabel="busy slots / capacity")
    ax.legend(fontsize="small")
    for row, used in ((0, len(names)), (1, len(runs)), (2, 1)):
        for col in range(used, cols):
            axes[row][col].set_visible(False)
    fig.suptitle(f"tierq simulate: {comparison.scenario.name}, {len(traffic):,} jobs")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
