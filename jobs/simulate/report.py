"""The figures of a run, per tier: what each tier's customers lived through.

Waits are from arrival to the first start, of the jobs that started. Jobs still queued when
the traffic ended are counted apart (``waiting``) with the longest wait they had reached
(``waiting_max_s``), so a starved tier shows even though none of its jobs started.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from jobs.simulate.engine import EXPIRED, FAILED, HELD, REFUSED, SERVED, WAITING, Run
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


@dataclass(frozen=True, kw_only=True)
class PolicyReport:
    policy: str
    jobs: int
    tiers: list[TierReport]
    utilisation: float
    cap_exceeded: int
    wall_s: float


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


def waits_by_tier(run: Run, traffic: Traffic) -> list[list[float]]:
    """The waits of the started jobs, per tier."""
    out: list[list[float]] = [[] for _ in traffic.tiers]
    tenant_tier, tenant = traffic.tenant_tier, traffic.tenant
    for job, start in enumerate(run.start):
        if start == start:  # not nan
            out[tenant_tier[tenant[job]]].append(start - run.enqueued[job])
    return out


def report(run: Run, traffic: Traffic) -> PolicyReport:
    ntiers = len(traffic.tiers)
    counts = [Counter[int]() for _ in range(ntiers)]
    refused = [Counter[str]() for _ in range(ntiers)]
    oldest_waiting = [math.inf] * ntiers
    errors: list[list[float]] = [[] for _ in range(ntiers)]
    for job, status in enumerate(run.status):
        tier = traffic.tenant_tier[traffic.tenant[job]]
        counts[tier][status] += 1
        if status == REFUSED:
            refused[tier][run.refusal[job] or "?"] += 1
        elif status == WAITING:
            oldest_waiting[tier] = min(oldest_waiting[tier], run.enqueued[job])
        told = run.told_wait_s[job]
        if told is not None and status in (SERVED, FAILED):
            errors[tier].append(abs(run.start[job] - run.enqueued[job] - told))
    per_tier = waits_by_tier(run, traffic)
    tiers = []
    for t, name in enumerate(traffic.tiers):
        members = [n for n, tier in enumerate(traffic.tenant_tier) if tier == t]
        caps = {run.caps[n] for n in members}
        tiers.append(TierReport(
            tier=name, policy=run.policy, submitted=sum(counts[t].values()),
            served=counts[t][SERVED] + counts[t][FAILED], refused=dict(refused[t]),
            expired=counts[t][EXPIRED], failed=counts[t][FAILED], waiting=counts[t][WAITING],
            held=counts[t][HELD],
            waiting_max_s=max(0.0, run.horizon_s - oldest_waiting[t]),
            waits=waits(per_tier[t]), overtaken_wait_s=run.overtaken_wait_s[t],
            overtaken_gap_s=run.overtaken_gap_s[t], tenants=len(members),
            peak=max((run.peak[n] for n in members), default=0),
            cap=max((c for c in caps if c is not None), default=None),
            told_error=waits(errors[t])))
    return PolicyReport(policy=run.policy, jobs=len(traffic), tiers=tiers,
                        utilisation=run.utilisation, cap_exceeded=run.cap_exceeded,
                        wall_s=run.wall_s)
