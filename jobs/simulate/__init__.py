"""``tierq simulate``: what each tier's customers would live through, before it is promised.

A discrete-event simulation on a virtual clock of a scenario's traffic (``scenario``,
``traffic``) against the real policy and the real in-memory dispatch index (``real``), next
to two baselines (``baselines``), all in one run on the same jobs (``engine``); a kind that
packs runs several items a slot (``packing``). The figures (``report``) are printed as a
table (``table``) and drawn (``plot``). Nothing here needs a running system: no SQL, no
Redis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jobs.core.errors import ConfigError
from jobs.core.policy import Policy
from jobs.core.pools import DEFAULT_POOL, Pools
from jobs.simulate.baselines import RescoreContender, StrictContender
from jobs.simulate.contender import Contender, Context
from jobs.simulate.engine import Engine, Run
from jobs.simulate.packing import NO_PACKING
from jobs.simulate.real import TierqContender
from jobs.simulate.report import PolicyReport, report
from jobs.simulate.scenario import Pool, Scenario
from jobs.simulate.traffic import Traffic, draw, ordered

CONTENDERS: dict[str, Callable[[Context], Contender]] = {
    "strict": StrictContender,
    "rescore": RescoreContender,
    "tierq": TierqContender,
}


@dataclass(frozen=True, kw_only=True)
class Comparison:
    scenario: Scenario
    traffic: Traffic
    runs: list[Run]
    reports: list[PolicyReport]


def traffic_for(pol: Policy, scenario: Scenario, *, jobs: int, seed: int) -> Traffic:
    """The scenario's first ``jobs`` arrivals, its tiers ordered best first."""
    traffic = draw(scenario, jobs, seed)
    missing = [name for name in traffic.tiers if name not in pol.tiers]
    if missing:
        raise ConfigError(f"scenario {scenario.name!r} sends tier(s) {', '.join(missing)} "
                          f"that the configuration lacks (it has {', '.join(pol.tiers)})")
    return ordered(traffic, {name: tier.base_priority for name, tier in pol.tiers.items()})


def pool_policy(pol: Policy, pool: Pool, configured: Pools | None = None) -> Policy:
    """The policy pool ``pool`` runs under, as ``Settings.pool_policy`` builds it: its own
    capacity and mean service time, the configuration's ``[pools.<name>]`` first, then the
    scenario's, else the policy's (``pool_concurrency`` sizes ``default`` only; another pool
    without its own is sized by its workers' slots)."""
    spec = configured.specs.get(pool.name) if configured is not None else None
    fallback = pol.pool_concurrency if pool.name == DEFAULT_POOL else None
    concurrency = (spec and spec.concurrency) or pool.concurrency or fallback
    mean = (spec and spec.mean_service_s) or pool.mean_service_s or pol.mean_service_s
    if (concurrency, mean) == (pol.pool_concurrency, pol.mean_service_s):
        return pol
    return dataclasses.replace(pol, pool_concurrency=concurrency, mean_service_s=mean)


def run_policy(pol: Policy, scenario: Scenario, traffic: Traffic, name: str,
             configured: Pools | None = None) -> Run:
    """One policy's run of ``traffic``: a contender of policy ``name`` per pool."""
    enqueued = list(traffic.arrival)
    kinds = (tuple(scenario.kinds.get(name, NO_PACKING) for name in traffic.kinds)
             if scenario.kinds else ())
    lanes = []
    for pool in scenario.pools:
        context = Context(policy=pool_policy(pol, pool, configured), traffic=traffic,
                          enqueued=enqueued, kinds=kinds)
        lanes.append((CONTENDERS[name](context), pool, context))
    (first, pool, context), others = lanes[0], [(c, p) for c, p, _ in lanes[1:]]
    return Engine(first, context, pool, others=others).simulate()


def compare(
    pol: Policy,
    scenario: Scenario,
    *,
    jobs: int | None = None,
    seed: int = 1,
    policies: Sequence[str] = tuple(CONTENDERS),
    configured: Pools | None = None,
) -> Comparison:
    """Simulate the same traffic under each of ``policies``; ``configured``: the pools of
    the configuration, whose figures win over the scenario's."""
    traffic = traffic_for(pol, scenario, jobs=jobs or scenario.jobs, seed=seed)
    runs = [run_policy(pol, scenario, traffic, name, configured) for name in policies]
    return Comparison(scenario=scenario, traffic=traffic, runs=runs,
                      reports=[report(run, traffic) for run in runs])
