"""The traffic of a scenario, drawn once: every policy of a run replays the same jobs.

Each job is an arrival time, a tenant (and its tier), its pool, a service time and how many
of its attempts fail, all drawn from seeded generators (one per stream, so adding a stream leaves
the others' draws alone). Jobs are numbered in arrival order; the columns are plain lists
because a million jobs must fit in seconds.
"""

from __future__ import annotations

import csv
import dataclasses
import heapq
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from jobs.core.errors import ConfigError
from jobs.core.pools import DEFAULT_POOL
from jobs.simulate.scenario import Scenario, ServiceTime, Stream

MAX_FAILURES = 100

# (arrival time, tenant name, tier, service seconds, failing attempts, max_wait_s, batch,
# pool index)
# time, tenant, tier, service seconds, failures, max_wait_s, batch, pool, kind
Arrival = tuple[float, str, str, float, int, float | None, bool, int, int]


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """Jobs ``0 .. n-1`` in arrival order, as columns."""

    tiers: list[str]  # the tiers that occur
    tenants: list[str]
    tenant_tier: list[int]  # tier index of each tenant
    arrival: list[float]
    tenant: list[int]
    service_s: list[float]
    failures: list[int]  # attempts that fail before one succeeds
    max_wait_s: list[float | None]
    batch: bytearray  # 1: a batch item, fed as its tenant has room
    # tenant → its own (cap, max_queued) overrides, either None for the tier's
    overrides: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    pools: tuple[str, ...] = (DEFAULT_POOL,)  # the scenario's, ``default`` first
    pool: bytearray = field(default_factory=bytearray)  # index in ``pools``; empty: all 0
    kinds: tuple[str, ...] = ("",)  # the jobs' kinds ("": a stream that names none)
    kind: list[int] = field(default_factory=list)  # index in ``kinds``; empty: all 0

    def __post_init__(self) -> None:
        if not self.pool:
            self.pool.extend(bytes(len(self.arrival)))
        if not self.kind:
            self.kind.extend([0] * len(self.arrival))

    def __len__(self) -> int:
        return len(self.arrival)

    def tier_of(self, job: int) -> int:
        return self.tenant_tier[self.tenant[job]]


def service_sampler(service: ServiceTime, rng: random.Random) -> Iterator[tuple[float, int]]:
    """Endless (service seconds, failing attempts) draws."""
    mean, p = service.mean_s, service.failure_rate
    mu = math.log(mean) - service.sigma**2 / 2  # lognormal with this mean
    while True:
        if service.distribution == "fixed":
            seconds = mean
        elif service.distribution == "exponential":
            seconds = rng.expovariate(1.0 / mean)
        else:
            seconds = rng.lognormvariate(mu, service.sigma)
        failures = 0
        while p and failures < MAX_FAILURES and rng.random() < p:
            failures += 1
        yield seconds, failures


def _times(stream: Stream, rng: random.Random) -> Iterator[float]:
    """Arrival times of the whole stream (all its tenants), ascending."""
    total = stream.rate_per_s * stream.tenants
    if stream.pattern == "poisson":
        t = 0.0
        while True:
            t += rng.expovariate(total)
            yield t
    elif stream.pattern == "diurnal":  # thinning a Poisson process at the peak rate
        peak, t = total * (1 + stream.amplitude), 0.0
        while True:
            t += rng.expovariate(peak)
            swing = math.sin(2 * math.pi * t / stream.period_s)
            if rng.random() * peak <= total * (1 + stream.amplitude * swing):
                yield t
    else:  # burst
        start = stream.at_s
        while True:
            yield from sorted(start + rng.random() * stream.spread_s for _ in range(stream.size))
            if stream.every_s is None:
                return
            start += stream.every_s


def _stream(stream: Stream, service: ServiceTime, pool: int, seed: int,
            kind: int = 0) -> Iterator[Arrival]:
    rng = random.Random(seed)
    draws = service_sampler(service, rng)
    if stream.pattern == "trace":
        yield from _trace(stream, draws, pool, kind)
        return
    names = [f"{stream.name}-{i}" for i in range(stream.tenants)]
    for n, t in enumerate(_times(stream, rng)):
        # Poisson and diurnal: each arrival's tenant at random; a burst: round robin.
        who = n % stream.tenants if stream.pattern == "burst" else rng.randrange(stream.tenants)
        seconds, failures = next(draws)
        yield (t, names[who], stream.tier, seconds, failures, stream.max_wait_s, stream.batch,
               pool, kind)


def _trace(stream: Stream, draws: Iterator[tuple[float, int]], pool: int,
           kind: int) -> Iterator[Arrival]:
    assert stream.trace is not None
    try:
        with stream.trace.open(newline="") as handle:
            rows = sorted(
                (float(row["time"]), row["tenant"], row.get("tier") or stream.tier,
                 float(row["service_s"]))
                for row in csv.DictReader(handle)
            )
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"trace {stream.trace}: needs columns time,tenant,tier,service_s "
                          f"({exc})") from None
    for t, tenant, tier, seconds in rows:
        yield (t, tenant, tier, seconds, next(draws)[1], stream.max_wait_s, stream.batch, pool,
               kind)


def draw(scenario: Scenario, jobs: int, seed: int) -> Traffic:
    """The first ``jobs`` arrivals of the scenario's streams, merged in time order."""
    kinds = {name: i for i, name in enumerate(dict.fromkeys(
        ["", *(s.kind or "" for s in scenario.streams)]))}
    streams = [_stream(s, scenario.service_of(s), scenario.pool_index(s), seed * 1_000_003 + i,
                       kinds[s.kind or ""])
               for i, s in enumerate(scenario.streams)]
    merged = heapq.merge(*streams, key=lambda arrival: arrival[0])
    tiers: dict[str, int] = {}
    tenants: dict[str, int] = {}
    tenant_tier: list[int] = []
    arrival: list[float] = []
    tenant: list[int] = []
    service_s: list[float] = []
    failures: list[int] = []
    max_wait_s: list[float | None] = []
    batch, pool = bytearray(), bytearray()
    kind: list[int] = []
    for t, name, tier, seconds, fails, max_wait, fed, where, of in itertools.islice(merged, jobs):
        who = tenants.get(name)
        if who is None:
            who = tenants[name] = len(tenants)
            tenant_tier.append(tiers.setdefault(tier, len(tiers)))
        elif tenant_tier[who] != tiers.get(tier):
            raise ConfigError(f"tenant {name!r} arrives in two tiers; a tenant has one tier")
        arrival.append(t)
        tenant.append(who)
        service_s.append(seconds)
        failures.append(fails)
        max_wait_s.append(max_wait)
        batch.append(fed)
        pool.append(where)
        kind.append(of)
    overrides = {
        tenants[f"{s.name}-{i}"]: (s.cap, s.max_queued)
        for s in scenario.streams if s.cap is not None or s.max_queued is not None
        for i in range(s.tenants) if f"{s.name}-{i}" in tenants
    }
    return Traffic(tiers=list(tiers), tenants=list(tenants), tenant_tier=tenant_tier,
                   arrival=arrival, tenant=tenant, service_s=service_s, failures=failures,
                   max_wait_s=max_wait_s, batch=batch, overrides=overrides,
                   pools=tuple(p.name for p in scenario.pools), pool=pool,
                   kinds=tuple(kinds), kind=kind)


def ordered(traffic: Traffic, rank: dict[str, float]) -> Traffic:
    """The same traffic with its tiers sorted by ``rank`` (best first)."""
    tiers = sorted(traffic.tiers, key=lambda name: (rank[name], name))
    where = [tiers.index(name) for name in traffic.tiers]
    return dataclasses.replace(traffic, tiers=tiers,
                               tenant_tier=[where[t] for t in traffic.tenant_tier])
