"""``tierq simulate``: what each tier's customers would live through, before it is promised.

A discrete-event simulation on a virtual clock of a scenario's traffic (``scenario``,
``traffic``) against the real policy and the real in-memory dispatch index (``real``), next
to two baselines (``baselines``), all in one run on the same jobs (``engine``). The figures
(``report``) are printed as a table (``table``) and drawn (``plot``). Nothing here needs a
running system: no SQL, no Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jobs.core.errors import ConfigError
from jobs.core.policy import Policy
from jobs.simulate.baselines import RescoreContender, StrictContender
from jobs.simulate.contender import Contender, Context
from jobs.simulate.engine import Engine, Run
from jobs.simulate.real import TierqContender
from jobs.simulate.report import PolicyReport, report
from jobs.simulate.scenario import Scenario
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


def compare(
    pol: Policy,
    scenario: Scenario,
    *,
    jobs: int | None = None,
    seed: int = 1,
    policies: Sequence[str] = tuple(CONTENDERS),
) -> Comparison:
    """Simulate the same traffic under each of ``policies``."""
    traffic = traffic_for(pol, scenario, jobs=jobs or scenario.jobs, seed=seed)
    runs = []
    for name in policies:
        context = Context(policy=pol, traffic=traffic, enqueued=list(traffic.arrival))
        runs.append(Engine(CONTENDERS[name](context), context, scenario.pool).simulate())
    return Comparison(scenario=scenario, traffic=traffic, runs=runs,
                      reports=[report(run, traffic) for run in runs])
