"""The comparison as Rich tables: per tier and policy, then per policy for the pool, and
with pools per pool and policy."""

from __future__ import annotations

from rich.table import Table

from jobs.core import policy
from jobs.core.policy import Policy
from jobs.simulate.report import (
    PolicyReport,
    PoolReport,
    TenantReport,
    TierReport,
    Waits,
    told_holds,
)
from jobs.simulate.scenario import Scenario

NONE = "-"


def seconds(value: float) -> str:
    if value != value:  # nan
        return NONE
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _refused(tier: TierReport | PoolReport) -> str:
    if not tier.refused:
        return NONE
    shown = sorted(tier.refused.items(), key=lambda item: -item[1])
    return "\n".join(f"{count:,} {key.split('/')[-1]}" for key, count in shown)


def _waiting(tier: TierReport) -> str:
    text = f"{tier.waiting:,}"
    if tier.waiting:
        text += f" ({seconds(tier.waiting_max_s)})"
    if tier.held:
        text += f"\n+{tier.held:,} in batch"
    return text


def _waits(waits: Waits | None) -> list[str]:
    if waits is None:
        return [NONE] * 4
    return [seconds(waits.p50), seconds(waits.p95), seconds(waits.p99), seconds(waits.max)]


def tier_table(reports: list[PolicyReport], title: str) -> Table:
    table = Table(title=title)
    table.add_column("tier", no_wrap=True)
    table.add_column("policy", no_wrap=True)
    # Expiry only happens to jobs with their own deadline: no column when none expired.
    expiry = any(t.expired for rep in reports for t in rep.tiers)
    for column in ("submitted", "served", "refused", *(["expired"] if expiry else []),
                   "waiting at\nend (oldest\ns)", "wait\np50 s", "p95", "p99", "max",
                   "overtaken\nafter s", "overtaker\ncame s\nlater", "tenant\npeak\n/ cap"):
        table.add_column(column, justify="right")
    tiers = [t.tier for t in reports[0].tiers]
    for i, name in enumerate(tiers):
        if i:
            table.add_section()
        for rep in reports:
            tier = rep.tiers[i]
            cap = NONE if tier.cap is None else str(tier.cap)
            table.add_row(
                name, rep.policy, f"{tier.submitted:,}", f"{tier.served:,}", _refused(tier),
                *([f"{tier.expired:,}"] if expiry else []), _waiting(tier),
                *_waits(tier.waits), seconds(tier.overtaken_wait_s),
                seconds(tier.overtaken_gap_s), f"{tier.peak}/{cap}")
    return table


def pool_table(reports: list[PolicyReport], title: str = "pool") -> Table:
    table = Table(title=title)
    table.add_column("policy")
    for column in ("utilisation", "starts over a cap", "told vs waited\np50 / p95 s (best tier)",
                   "simulated in s", "jobs/s"):
        table.add_column(column, justify="right")
    for rep in reports:
        told = rep.tiers[0].told_error
        error = NONE if told is None else f"{seconds(told.p50)} / {seconds(told.p95)}"
        rate = rep.jobs / rep.wall_s if rep.wall_s else 0.0
        table.add_row(rep.policy, f"{rep.utilisation:.1%}", f"{rep.cap_exceeded:,}", error,
                      f"{rep.wall_s:.2f}", f"{rate:,.0f}")
    return table


def told_table(reports: list[PolicyReport], floor_s: float) -> Table | None:
    """Per tier, what the served jobs were told against what they waited, for each policy
    that tells an estimate: the two distributions' p50 and p95 side by side, each job's own
    error, and whether they agree (``report.told_holds``, to within ``floor_s``)."""
    table = Table(title="told vs waited (served jobs that were told an estimate)")
    table.add_column("tier", no_wrap=True)
    table.add_column("policy", no_wrap=True)
    for column in ("told\np50 s", "waited\np50 s", "told\np95 s", "waited\np95 s",
                   "|waited − told|\np50 / p95 s", "holds"):
        table.add_column(column, justify="right")
    rows = 0
    for i, tier in enumerate(reports[0].tiers):
        for rep in reports:
            row = rep.tiers[i]
            told, waited, error = row.told, row.told_waited, row.told_error
            if told is None or waited is None or error is None:
                continue
            table.add_row(tier.tier, rep.policy, seconds(told.p50), seconds(waited.p50),
                          seconds(told.p95), seconds(waited.p95),
                          f"{seconds(error.p50)} / {seconds(error.p95)}",
                          "yes" if told_holds(row, floor_s) else "no")
            rows += 1
    return table if rows else None


def pools_table(reports: list[PolicyReport], scenario: Scenario) -> Table:
    """Per pool and policy: each pool is admitted and served on its own figures."""
    table = Table(title="per pool")
    table.add_column("pool", no_wrap=True)
    table.add_column("policy", no_wrap=True)
    for column in ("workers\n× slots", "submitted", "served", "refused",
                   "waiting at\nend (oldest\ns)", "wait\np50 s", "p95", "max", "utilisation"):
        table.add_column(column, justify="right")
    for i, pool in enumerate(scenario.pools):
        if i:
            table.add_section()
        for rep in reports:
            row = rep.pools[i]
            waiting = f"{row.waiting:,}" + (f" ({seconds(row.waiting_max_s)})" if row.waiting
                                            else "")
            table.add_row(pool.name, rep.policy, f"{pool.workers} × {pool.slots}",
                          f"{row.submitted:,}", f"{row.served:,}", _refused(row), waiting,
                          *(_waits(row.waits)[k] for k in (0, 1, 3)), f"{row.utilisation:.1%}")
    return table


def runs_table(reports: list[PolicyReport]) -> Table | None:
    """Per kind that packs and policy: the runs its slots took and the items they held."""
    table = Table(title="runs (kinds that pack)")
    table.add_column("kind", no_wrap=True)
    table.add_column("policy", no_wrap=True)
    for column in ("runs", "items", "items per\nrun (mean)", "items/s"):
        table.add_column(column, justify="right")
    kinds = sorted({kind for rep in reports for kind in rep.runs})
    for i, kind in enumerate(kinds):
        if i:
            table.add_section()
        for rep in reports:
            runs = rep.runs.get(kind)
            if runs is not None:
                table.add_row(kind, rep.policy, f"{runs.runs:,}", f"{runs.items:,}",
                              f"{runs.items_per_run:.1f}", f"{runs.items_per_s:,.1f}")
    return table if kinds else None


def tenant_table(tenants: list[TenantReport]) -> Table:
    """The busiest tenants: what each policy served them and the most they ran at once."""
    table = Table(title="busiest tenants")
    table.add_column("tenant")
    table.add_column("tier")
    table.add_column("submitted", justify="right")
    policies = list(tenants[0].served) if tenants else []
    for name in policies:
        table.add_column(f"{name}\nserved", justify="right")
        table.add_column(f"{name}\npeak / cap", justify="right")
    for tenant in tenants:
        cells = []
        for name in policies:
            cap = tenant.cap[name]
            cells += [f"{tenant.served[name]:,}",
                      f"{tenant.peak[name]} / {NONE if cap is None else cap}"]
        table.add_row(tenant.tenant, tenant.tier, f"{tenant.submitted:,}", *cells)
    return table


def guarantee_lines(pol: Policy, reports: list[PolicyReport]) -> list[str]:
    """One line per tier below the best: its ageing guarantee and the worst overtaking seen
    under each policy."""
    rows = [(i, pol.tier(t.tier)) for i, t in enumerate(reports[0].tiers)
            if not t.tier.endswith(" batch")]
    best = min((tier for _, tier in rows), key=lambda t: t.base_priority)
    lines = []
    for i, tier in rows:
        if tier.base_priority == best.base_priority:
            continue
        after = policy.ageing_guarantee_s(tier, pol.tiers, pol.ageing_rate_s)
        seen = ", ".join(f"{rep.policy} {seconds(rep.tiers[i].overtaken_gap_s)} s"
                         for rep in reports)
        lines.append(f"A {tier.name} job ties with fresh {best.name} work after {after:g} s; "
                     f"the latest later arrival served first: {seen}.")
    return lines
