"""The figures of a run, per tier: what each tier's customers lived through.

Waits are from arrival to the first start, of the jobs that started. Jobs still queued when
the traffic ended are counted apart (``waiting``) with the longest wait they had reached
(``waiting_max_s``), so a starved tier shows even though none of its jobs started. With
pools, each pool has its own figures too: a flood in one must not show in another's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from jobs.simulate.outcome import EXPIRED, FAILED, HELD, REFUSED, SERVED, WAITING, Run
from jobs.simulate.scenario import Scenario
from jobs.simulate.traffic import Traffic


@dataclass(frozen=True, kw_only=True)
class Waits:
    p50: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True, kw_only=True)
class TierReport:
    tier: str
    policy: str
    submitted: int
    served: int
    refused: dict[str, int]  # "cause/limit" → jobs
    expired: int
    failed: int
    waiting: int  # still queued at the end
    held: int  # batch items the feeder had not admitted by the end
    waiting_max_s: float
    waits: Waits | None  # None: nothing served
    overtaken_wait_s: float
    overtaken_gap_s: float
    tenants: int
    peak: int  # most jobs one tenant ran at once
    cap: int | None  # the largest cap its tenants had (None: no cap)
    # |waited − told| of served jobs that were told an estimate (None: none told)
    told_error: Waits | None
    # Those jobs' told waits and their waits, each distribution on its own (None: none told)
    told: Waits | None = None
    told_waited: Waits | None = None


@dataclass(frozen=True, kw_only=True)
class PoolReport:
    """One pool's jobs under one policy, all tiers together."""

    pool: str
    policy: str
    submitted: int
    served: int
    refused: dict[str, int]  # "cause/limit" → jobs
    waiting: int  # still queued at the end (or held in a batch)
    waiting_max_s: float
    waits: Waits | None  # None: nothing served
    utilisation: float


@dataclass(frozen=True, kw_only=True)
class RunsReport:
    """The runs of one kind that packs: how many started, holding how many items."""

    runs: int
    items: int  # started, each start of an item counted (a retry again)
    items_per_s: float  # items started per simulated second

    @property
    def items_per_run(self) -> float:
        return self.items / self.runs if self.runs else 0.0


@dataclass(frozen=True, kw_only=True)
class PolicyReport:
    policy: str
    jobs: int
    tiers: list[TierReport]
    utilisation: float
    cap_exceeded: int
    wall_s: float
    pools: list[PoolReport] = field(default_factory=list)  # only with more than one pool
    # Per kind that packs: its runs and the items they held (``items_per_run``).
    runs: dict[str, RunsReport] = field(default_factory=dict)


def told_floor_s(scenario: Scenario) -> float:
    """The finest a told wait can be: the shortest mean service time of the scenario's jobs
    (a kind that packs: a run of one)."""
    return min(scenario.service_of(stream).mean_s for stream in scenario.streams)


def told_holds(tier: TierReport, floor_s: float) -> bool | None:
    """Whether what a tier's served jobs were told agrees with what they waited, as two
    distributions: the medians within 10 % of each other and the p95s within 25 %, or within
    ``floor_s`` where that is more (a slot frees once per service time: no estimate is
    finer). None: none was told an estimate."""
    told, waited = tier.told, tier.told_waited
    if told is None or waited is None:
        return None
    return (abs(told.p50 - waited.p50) <= max(floor_s, 0.10 * waited.p50)
            and abs(told.p95 - waited.p95) <= max(floor_s, 0.25 * waited.p95))


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (``q`` in 0..1)."""
    if not ordered:
        raise ValueError("no values")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def waits(values: list[float]) -> Waits | None:
    if not values:
        return None
    values = sorted(values)
    return Waits(p50=percentile(values, 0.5), p95=percentile(values, 0.95),
                 p99=percentile(values, 0.99), max=values[-1])


@dataclass
class _Row:
    """What one row of the report gathers as the jobs are walked."""

    counts: Counter[int] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    oldest_waiting: float = math.inf
    waits: list[float] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)  # |waited - told|
    told: list[float] = field(default_factory=list)  # what the served jobs were told
    told_waited: list[float] = field(default_factory=list)  # what the same jobs waited
    tenants: set[int] = field(default_factory=set)

    def add(self, run: Run, job: int, status: int) -> None:
        """Count one job: its status, its wait once started, why it was refused, how long it
        has waited when still waiting at the end."""
        self.counts[status] += 1
        start = run.start[job]
        if start == start:  # not nan: started
            self.waits.append(start - run.enqueued[job])
        if status == REFUSED:
            self.refused[run.refusal[job] or "?"] += 1
        elif status == WAITING:
            self.oldest_waiting = min(self.oldest_waiting, run.enqueued[job])


def _walk(run: Run, traffic: Traffic) -> list[_Row]:
    """Rows ``0 .. tiers-1`` for the tiers' interactive jobs, ``tiers + t`` for tier t's batch
    items: a batch waits for its tenant's quota, interactive work should not."""
    ntiers = len(traffic.tiers)
    rows = [_Row() for _ in range(2 * ntiers)]
    # The columns, bound once: this walks every job.
    tenant_of, tenant_tier, batch = traffic.tenant, traffic.tenant_tier, traffic.batch
    told_wait_s, start, enqueued = run.told_wait_s, run.start, run.enqueued
    for job, status in enumerate(run.status):
        tenant = tenant_of[job]
        row = rows[tenant_tier[tenant] + (ntiers if batch[job] else 0)]
        row.add(run, job, status)
        row.tenants.add(tenant)
        told = told_wait_s[job]
        if told is not None and status in (SERVED, FAILED):
            waited = start[job] - enqueued[job]
            row.errors.append(abs(waited - told))
            row.told.append(told)
            row.told_waited.append(waited)
    return rows


@dataclass(frozen=True, kw_only=True)
class RowWaits:
    """A row's waits (of the jobs that started) and how many jobs it admitted."""

    name: str  # the tier, or "<tier> batch"
    waits: list[float]
    admitted: int


def row_waits(run: Run, traffic: Traffic) -> list[RowWaits]:
    """Per row of the report (tiers best first, a tier's batch after it)."""
    ntiers = len(traffic.tiers)
    out = []
    for r, row in enumerate(_walk(run, traffic)):
        if row.counts:
            admitted = sum(row.counts[s] for s in (WAITING, SERVED, EXPIRED, FAILED))
            name = traffic.tiers[r % ntiers] + (" batch" if r >= ntiers else "")
            out.append(RowWaits(name=name, waits=row.waits, admitted=admitted))
    out.sort(key=lambda row: traffic.tiers.index(row.name.removesuffix(" batch")))
    return out


def report(run: Run, traffic: Traffic) -> PolicyReport:
    ntiers = len(traffic.tiers)
    rows = _walk(run, traffic)
    tiers = []
    for r, row in enumerate(rows):
        if not row.counts:
            continue
        t = r % ntiers
        batch = r >= ntiers
        counts = row.counts
        caps = [run.caps[n] for n in row.tenants]
        tiers.append(TierReport(
            tier=traffic.tiers[t] + (" batch" if batch else ""), policy=run.policy,
            submitted=sum(counts.values()), served=counts[SERVED] + counts[FAILED],
            refused=dict(row.refused), expired=counts[EXPIRED], failed=counts[FAILED],
            waiting=counts[WAITING], held=counts[HELD],
            waiting_max_s=max(0.0, run.horizon_s - row.oldest_waiting),
            waits=waits(row.waits),
            # Overtaking is measured per tier, on its interactive row.
            overtaken_wait_s=math.nan if batch else run.overtaken_wait_s[t],
            overtaken_gap_s=math.nan if batch else run.overtaken_gap_s[t],
            tenants=len(row.tenants), peak=max((run.peak[n] for n in row.tenants), default=0),
            cap=max((c for c in caps if c is not None), default=None),
            told_error=waits(row.errors), told=waits(row.told),
            told_waited=waits(row.told_waited)))
    tiers.sort(key=lambda tier: traffic.tiers.index(tier.tier.removesuffix(" batch")))
    return PolicyReport(policy=run.policy, jobs=len(traffic), tiers=tiers,
                        utilisation=run.utilisation, cap_exceeded=run.cap_exceeded,
                        wall_s=run.wall_s,
                        pools=pool_reports(run, traffic) if len(traffic.pools) > 1 else [],
                        runs={kind: RunsReport(runs=runs, items=items,
                                               items_per_s=items / run.horizon_s
                                               if run.horizon_s else 0.0)
                              for kind, (runs, items) in sorted(run.run_items.items())})


def pool_reports(run: Run, traffic: Traffic) -> list[PoolReport]:
    """Per pool (``traffic.pools`` order): its jobs, refusals, waits and utilisation."""
    rows = [_Row() for _ in traffic.pools]
    for job, status in enumerate(run.status):
        rows[traffic.pool[job]].add(run, job, status)
    return [PoolReport(
        pool=name, policy=run.policy, submitted=sum(row.counts.values()),
        served=row.counts[SERVED] + row.counts[FAILED], refused=dict(row.refused),
        waiting=row.counts[WAITING] + row.counts[HELD],
        waiting_max_s=max(0.0, run.horizon_s - row.oldest_waiting), waits=waits(row.waits),
        utilisation=run.pool_utilisation(p)) for p, (name, row) in enumerate(
            zip(traffic.pools, rows, strict=True))]


@dataclass(frozen=True, kw_only=True)
class TenantReport:
    """One tenant across the policies: jobs served and the most it ran at once, by policy."""

    tenant: str
    tier: str
    submitted: int
    served: dict[str, int]
    peak: dict[str, int]
    cap: dict[str, int | None]


def busiest_tenants(runs: list[Run], traffic: Traffic, top: int = 5) -> list[TenantReport]:
    """The ``top`` tenants by jobs submitted (ties: the better tier, then the name)."""
    submitted = Counter(traffic.tenant)
    chosen = sorted(submitted, key=lambda n: (-submitted[n], traffic.tenant_tier[n],
                                              traffic.tenants[n]))[:top]
    served = {run.policy: Counter[int]() for run in runs}
    for run in runs:
        mine = served[run.policy]
        for job, start in enumerate(run.start):
            if start == start:
                mine[traffic.tenant[job]] += 1
    return [TenantReport(
        tenant=traffic.tenants[n], tier=traffic.tiers[traffic.tenant_tier[n]],
        submitted=submitted[n], served={run.policy: served[run.policy][n] for run in runs},
        peak={run.policy: run.peak[n] for run in runs},
        cap={run.policy: run.caps[n] for run in runs}) for n in chosen]
