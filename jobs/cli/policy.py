"""``tierq policy``: the numbers that follow from the configuration, next to the live ones.

"configured": what the policy gives for the configured ``pool_concurrency`` and
``mean_service_s`` (unknown capacity when the pool is sized by its live workers).
"live": what admission uses right now, read from Redis: the capacity in force (configured,
or the live workers' slots) and the mean service time the dispatcher measured, once
``service_samples_min`` runs back it. Without Redis only the configured column is filled.
The pool, the index and Redis are imported inside the functions that read them, so loading
this module (for ``tierq --help``) stays quick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from jobs.cli.common import friendly
from jobs.core import policy
from jobs.core.errors import ConfigError
from jobs.process.settings import Settings, load_settings

if TYPE_CHECKING:
    from jobs.core.policy import MeasuredMean
    from jobs.fleet.pool import PoolFigures
    from jobs.index.base import LiveWorker

NONE = "-"


@dataclass(frozen=True, kw_only=True)
class LiveView:
    figures: PoolFigures
    worker_slots: int
    measured: MeasuredMean | None
    workers: list[LiveWorker] = field(default_factory=list)
    # Each tier's jobs/s admitted over policy.arrivals_window_s, as the leader published it.
    arrivals: dict[str, float] = field(default_factory=dict)


def read_live(
    settings: Settings, pol: policy.Policy, pool_name: str = "default"
) -> tuple[LiveView | None, str]:
    """The live figures of pool ``pool_name`` from Redis, or None and why there are none."""
    import redis

    from jobs.fleet import pool
    from jobs.fleet.service_rate import read_measured
    from jobs.index.redis_index import RedisIndex
    from jobs.process.runtime import redis_client

    try:
        url = settings.resolved_redis_url()
    except ConfigError as exc:
        return None, f"{exc.message}: configured figures only."
    client = redis_client(url)
    prefix = settings.pool_prefix(pool_name)
    index = RedisIndex(client, prefix, root=settings.key_prefix)
    try:
        now = index.now()  # Redis's clock: this host's may be off
        measured = read_measured(client, prefix)
        figures = pool.read_pool(pol, index, now=now, measured=measured)
        view = LiveView(figures=figures, worker_slots=index.pool_capacity(now=now),
                        measured=measured, workers=index.live_workers(now=now),
                        arrivals={tier: a.rate_per_s
                                  for tier, a in index.work().arrivals.items()})
        return view, ""
    except (redis.RedisError, OSError):
        return None, f"Redis at {url} is not reachable: configured figures only."
    finally:
        client.close()


def configured_figures(pol: policy.Policy) -> PoolFigures | None:
    from jobs.fleet import pool

    if pol.pool_concurrency is None:
        return None
    return pool.figures(pol, capacity=pol.pool_concurrency, inflight=0)


def _num(value: float) -> str:
    return f"{value:.3g}"


def _live_mean(pol: policy.Policy, live: LiveView) -> str:
    measured = live.measured
    mean = f"{_num(live.figures.mean_service_s)} s"
    if live.figures.service_samples:
        return f"{mean} (measured, {live.figures.service_samples} runs)"
    have = 0 if measured is None else measured.samples
    return f"{mean} (configured; {have} of {pol.service_samples_min} runs measured)"


def pool_table(pol: policy.Policy, configured: PoolFigures | None,
               live: LiveView | None, title: str = "pool") -> Table:
    table = Table(title=title)
    for column in ("figure", "configured", "live"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    source = "configured" if pol.pool_concurrency is not None else "live workers"
    conf_capacity = NONE if configured is None else str(configured.capacity)
    table.add_row("capacity", conf_capacity,
                  NONE if live is None else f"{live.figures.capacity} ({source})")
    table.add_row("live worker slots", NONE, NONE if live is None else str(live.worker_slots))
    table.add_row("in flight", NONE, NONE if live is None else str(live.figures.inflight))
    table.add_row("mean service time", f"{_num(pol.mean_service_s)} s",
                  NONE if live is None else _live_mean(pol, live))
    table.add_row("service rate μ",
                  NONE if configured is None else f"{_num(configured.service_rate)} jobs/s",
                  NONE if live is None else f"{_num(live.figures.service_rate)} jobs/s")
    return table


def workers_table(live: LiveView, title: str = "live workers") -> Table:
    """The live workers: the device each runs on and the slots it brings to the pool."""
    table = Table(title=title)
    table.add_column("worker")
    table.add_column("device")
    table.add_column("slots", justify="right")
    for worker in live.workers:
        memory = worker.memory_bytes
        device = worker.device if memory is None else f"{worker.device} ({memory / 2**30:.0f} GiB)"
        table.add_row(worker.worker_id, device, str(worker.slots))
    return table


def tier_table(pol: policy.Policy, configured: PoolFigures | None,
               live: LiveView | None, title: str = "tiers") -> Table:
    best = min(pol.tiers.values(), key=lambda t: t.base_priority)
    table = Table(title=title)
    table.add_column("tier")
    for column in ("priority", "max wait s", *(f"{figure}\n{side}" for figure in
                   ("bound", "tenant cap", "tenant quota") for side in ("configured", "live")),
                   "rate /s", f"ties with {best.name} after", "admitted /s\nlive"):
        table.add_column(column, justify="right")
    for name, tier in pol.tiers.items():
        cells = []
        for pick in ("bounds", "caps", "quotas"):
            for figures in (configured, None if live is None else live.figures):
                cells.append(NONE if figures is None else str(getattr(figures, pick)[name]))
        limit = policy.rate_limit(tier)
        rate = NONE if limit is None else f"{_num(limit.rate_per_s)} (burst {limit.burst})"
        guarantee = policy.ageing_guarantee_s(tier, pol.tiers, pol.ageing_rate_s)
        admitted = NONE if live is None else _num(live.arrivals.get(name, 0.0))
        table.add_row(name, f"{tier.base_priority:g}", f"{tier.max_wait_s:g}", *cells, rate,
                      f"{guarantee:g} s", admitted)
    return table


def print_policy(settings: Settings, console: Console) -> None:
    """Print each pool's figures and its tiers', configured next to live, and the ageing
    guarantee. Without ``[pools]`` there is one pool and the tables are titled as before."""
    pools = settings.pool_set()
    note = ""
    idle: list[str] = []
    for name in pools.names:
        pol = settings.pool_policy(name)
        configured = configured_figures(pol)
        live, note = read_live(settings, pol, name)
        pool_title, of = "pool", ""
        if pools.pooled:
            kinds = pools.spec(name).kinds
            runs = ", ".join(sorted(kinds)) if name != "default" else "every other kind"
            pool_title, of = f"pool {name} ({runs})", f" of pool {name}"
        console.print(pool_table(pol, configured, live, title=pool_title))
        if live is not None and live.workers:
            console.print(workers_table(live, title=f"live workers{of}"))
        console.print(tier_table(pol, configured, live, title=f"tiers{of}"))
        if live is not None and not live.figures.capacity:
            idle.append(name)
    pol = settings.build_policy()
    best = min(pol.tiers.values(), key=lambda t: t.base_priority)
    for name, tier in pol.tiers.items():
        if tier is not best:
            after = policy.ageing_guarantee_s(tier, pol.tiers, pol.ageing_rate_s)
            console.print(f"A {name} job ties with fresh {best.name} work after {after:g} s.")
    console.print(f"ageing rate: {pol.ageing_rate_s:g} s per priority point")
    if pol.client_timeout_s is not None:
        console.print(f"client timeout: {pol.client_timeout_s:g} s (caps every max wait)")
    for name in idle:
        where = f" in pool {name}" if pools.pooled else ""
        console.print(f"No live workers yet{where}: every bound and cap is 1 until one "
                      "registers.")
    if note:
        console.print(note)


@friendly
def show_policy() -> None:
    """Print the numbers that follow from the configuration, next to the live ones:
    capacity, mean service time, μ, bounds, caps, quotas, the ageing guarantee."""
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:  # piped or captured: room for the whole table
        console = Console(highlight=False, soft_wrap=True, width=max(console.width, 132))
    print_policy(load_settings(), console)
