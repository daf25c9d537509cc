"""Scenarios: the traffic a simulation replays, read from TOML.

A scenario names the pool (workers and their slots, and when workers join, leave or crash),
the service-time distribution, and the streams of arrivals per tier and tenant. The policy
(tiers, shares, bounds, ageing rate) is not part of it: that comes from the configuration,
so one scenario checks any configuration. The named scenarios ship in
``jobs/simulate/scenarios/``; any other file is read by path. A stream may replay a trace
(a CSV of ``time,tenant,tier,service_s``, relative to the scenario file).

Instead of ``[pool]``, a scenario may declare pools (``jobs.core.pools``), each with its
workers and slots, the kinds it runs, and what a configuration's ``[pools.<name>]`` would set
(``concurrency``, ``mean_service_s``; the configuration's own win). A stream names its jobs'
``kind`` (their pool is the one that lists it, else ``default``) or its ``pool``:

    [pools.default]
    workers = 3
    slots = 8
    [pools.gpu]
    kinds = ["render"]
    workers = 2
    slots = 4
    mean_service_s = 120
    service = {distribution = "lognormal", mean_s = 120}   # its jobs' (default: [service])
    [[streams]]
    tier = "standard"
    kind = "render"
    rate_per_s = 0.2

    name = "seed"
    jobs = 200000                     # default --jobs
    [pool]
    workers = 3
    slots = 8                         # per worker
    changes = [{at_s = 3600, workers = -1, crash = true}]
    [service]
    distribution = "exponential"      # fixed | exponential | lognormal (sigma)
    mean_s = 6.0
    [[streams]]
    tier = "premium"
    tenants = 4                       # tenants premium-0 .. premium-3
    rate_per_s = 1.25                 # per tenant: poisson, or diurnal / burst (below)

A kind may pack (``[kinds."<kind>"]``, as a configuration's ``max_items_per_run``): a run
of ``n`` of its items takes about ``a + b × n`` seconds, so its items are drawn at a mean of
``a + b`` (a run of one) and a run of ``n`` takes its first item's draw times
``(a + b × n) / (a + b)``:

    [kinds."eval.similarity"]
    max_items_per_run = 32            # 1 (the default): the kind does not pack
    run_time = {a = 0.05, b = 0.01}
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import MISSING, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from jobs.core.errors import ConfigError
from jobs.core.pools import DEFAULT_POOL, Pools, PoolSpec
from jobs.simulate.packing import Kind, kinds_from, with_max_items

DISTRIBUTIONS = ("fixed", "exponential", "lognormal")
PATTERNS = ("poisson", "diurnal", "burst", "trace")
MAX_POOLS = 256  # a job's pool is one byte of ``jobs.simulate.traffic.Traffic.pool``


@dataclass(frozen=True, kw_only=True)
class ServiceTime:
    """How long a job runs once started (seconds)."""

    distribution: str = "exponential"
    mean_s: float = 6.0
    sigma: float = 1.0  # lognormal: the standard deviation of log(service time)
    # Chance that an attempt fails with a retryable error (retried with backoff).
    failure_rate: float = 0.0


@dataclass(frozen=True, kw_only=True)
class PoolChange:
    """Workers joining (positive) or leaving (negative) at ``at_s``; a crash loses the jobs
    running on the workers that leave (their leases lapse and they are re-queued)."""

    at_s: float
    workers: int
    crash: bool = False


@dataclass(frozen=True, kw_only=True)
class Pool:
    """Workers of ``slots`` each; with pools, also what the pool runs and its own figures."""

    workers: int
    slots: int
    changes: tuple[PoolChange, ...] = ()
    name: str = DEFAULT_POOL
    kinds: frozenset[str] = frozenset()
    # As ``[pools.<name>]`` of a configuration sets them (None: the policy's).
    concurrency: int | None = None
    mean_service_s: float | None = None
    service: ServiceTime | None = None  # its jobs' service time (None: the scenario's)


@dataclass(frozen=True, kw_only=True)
class Stream:
    """Arrivals of one tier from ``tenants`` tenants (``name-0``, ``name-1``, ...), each at
    ``rate_per_s`` on average: ``poisson``; ``diurnal`` (the rate swings by ``amplitude``
    over ``period_s``); ``burst`` (``size`` jobs at ``at_s``, spread over ``spread_s``,
    every ``every_s`` if set); ``trace`` (the rows of a CSV file)."""

    tier: str
    name: str
    tenants: int = 1
    pattern: str = "poisson"
    rate_per_s: float = 0.0
    period_s: float = 86400.0
    amplitude: float = 0.8
    at_s: float = 0.0
    size: int = 0
    spread_s: float = 0.0
    every_s: float | None = None
    trace: Path | None = None
    # The client's own deadline: refused if it would start later, expired if it does.
    max_wait_s: float | None = None
    # Uploaded as a batch: the batch feeder admits the jobs as their tenant has room, and
    # their wait (and ageing) starts then.
    batch: bool = False
    # The tenants' own overrides of their tier's cap and queued quota (as `tierq tenants
    # update --cap N --max-queued N` sets them); None: the tier's. They apply to the tenants
    # the stream names (``name-0`` ...), not to those of a trace file.
    cap: int | None = None
    max_queued: int | None = None
    service: ServiceTime | None = None  # None: its pool's, else the scenario's
    # The jobs' kind, which decides their pool; or the pool itself (None: ``default``).
    kind: str | None = None
    pool: str | None = None


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    description: str
    jobs: int
    pools: tuple[Pool, ...]  # ``default`` first, as ``jobs.core.pools.Pools.names``
    service: ServiceTime
    streams: tuple[Stream, ...]
    source: Path | None = field(default=None, compare=False)
    kinds: dict[str, Kind] = field(default_factory=dict)  # ``[kinds."<kind>"]``

    @property
    def pool(self) -> Pool:
        """The first pool: the only one of a scenario without pools."""
        return self.pools[0]

    def tiers(self) -> list[str]:
        return list(dict.fromkeys(stream.tier for stream in self.streams))

    def pool_index(self, stream: Stream) -> int:
        """Where the stream's jobs run: the index of their pool in ``pools``."""
        owner = _pool_set(self.pools).pool_of(stream.kind) if stream.kind else DEFAULT_POOL
        return [p.name for p in self.pools].index(stream.pool or owner)

    def service_of(self, stream: Stream) -> ServiceTime:
        """Its jobs' draws; a kind with a run-time model is drawn at the mean of a run of one."""
        service = stream.service or self.pools[self.pool_index(stream)].service or self.service
        kind = self.kinds.get(stream.kind or "")
        if kind is not None and kind.run_time is not None:
            return dataclasses.replace(service, mean_s=kind.run_time.seconds(1))
        return service

    def packs(self) -> bool:
        return any(kind.packs for kind in self.kinds.values())

    def with_packing(self, max_items: dict[str, int]) -> Scenario:
        """The scenario with these kinds' ``max_items_per_run`` (``--packing KIND=MAX``)."""
        return dataclasses.replace(self, kinds=with_max_items(
            self.kinds, max_items, _sent(self.streams)))


def _sent(streams: tuple[Stream, ...]) -> set[str]:
    """The kinds the streams send."""
    return {stream.kind for stream in streams if stream.kind}


def named() -> list[str]:
    """The scenarios shipped with tierq."""
    folder = resources.files("jobs.simulate") / "scenarios"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir()
                  if p.name.endswith(".toml"))


def load(name_or_path: str) -> Scenario:
    """A shipped scenario by name, or a TOML file by path. Raises ``ConfigError``."""
    path = Path(name_or_path)
    if name_or_path in named():
        text = (resources.files("jobs.simulate") / "scenarios" / f"{name_or_path}.toml")
        return parse(tomllib.loads(text.read_text()), name_or_path, None)
    if not path.is_file():
        raise ConfigError(f"no scenario {name_or_path!r}: name one of {', '.join(named())}, "
                          "or give the path of a TOML file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"scenario {path} is not valid TOML: {exc}") from None
    return parse(data, path.stem, path)


def _service(data: dict[str, Any], where: str) -> ServiceTime:
    service = ServiceTime(**_known(data, ServiceTime, where))
    if service.distribution not in DISTRIBUTIONS:
        raise ConfigError(f"{where}.distribution: one of {', '.join(DISTRIBUTIONS)}, "
                          f"not {service.distribution!r}")
    if service.mean_s <= 0 or service.sigma < 0 or not 0 <= service.failure_rate < 1:
        raise ConfigError(f"{where}: mean_s > 0, sigma >= 0 and 0 <= failure_rate < 1")
    return service


def _known(data: dict[str, Any], cls: Any, where: str) -> dict[str, Any]:
    """``data`` when it names only the dataclass ``cls``'s fields and all its required ones."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    missing = [name for name, f in fields.items()
               if name not in data and f.default is MISSING and f.default_factory is MISSING
               and name not in ("changes", "name")]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    return dict(data)


def _stream(data: dict[str, Any], i: int, base: Path | None) -> Stream:
    where = f"streams[{i}]"
    values = _known(data, Stream, where)
    if "tier" not in values:
        raise ConfigError(f"{where}: a stream needs its tier")
    values.setdefault("name", values["tier"])
    if "service" in values:
        values["service"] = _service(values["service"], f"{where}.service")
    if "trace" in values:
        trace = Path(values["trace"])
        values["trace"] = trace if trace.is_absolute() or base is None else base / trace
        values.setdefault("pattern", "trace")
    stream = Stream(**values)
    if stream.pattern not in PATTERNS:
        raise ConfigError(f"{where}.pattern: one of {', '.join(PATTERNS)}")
    if stream.pattern == "trace" and stream.trace is None:
        raise ConfigError(f"{where}: a trace stream needs its trace file")
    if stream.tenants < 1 or stream.rate_per_s < 0 or stream.size < 0:
        raise ConfigError(f"{where}: tenants >= 1, rate_per_s >= 0 and size >= 0")
    if stream.pattern in ("poisson", "diurnal") and stream.rate_per_s <= 0:
        raise ConfigError(f"{where}: a {stream.pattern} stream needs rate_per_s > 0")
    if stream.pattern == "burst" and stream.size <= 0:
        raise ConfigError(f"{where}: a burst stream needs size > 0")
    if any(v is not None and v < 1 for v in (stream.cap, stream.max_queued)):
        raise ConfigError(f"{where}: cap and max_queued are at least 1")
    if any(v is not None and not (isinstance(v, str) and v) for v in (stream.kind, stream.pool)):
        raise ConfigError(f"{where}: kind and pool are names")
    return stream


def _pool(data: Any, name: str, where: str) -> Pool:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a table of workers, slots, ...")
    if "name" in data:
        raise ConfigError(f"{where}: unknown field(s) name")
    values = _known(data, Pool, where)
    values["changes"] = tuple(PoolChange(**_known(c, PoolChange, f"{where}.changes"))
                              for c in values.get("changes", []))
    kinds = values.get("kinds", [])
    if not isinstance(kinds, list) or not all(isinstance(k, str) and k for k in kinds):
        raise ConfigError(f"{where}.kinds: a list of kind names")
    values["kinds"] = frozenset(kinds)
    if "service" in values:
        values["service"] = _service(dict(values["service"]), f"{where}.service")
    pool = Pool(**values, name=name)
    if pool.workers < 1 or pool.slots < 1:
        raise ConfigError(f"{where}: workers >= 1 and slots >= 1")
    if ((pool.concurrency is not None and pool.concurrency < 1)
            or (pool.mean_service_s is not None and pool.mean_service_s <= 0)):
        raise ConfigError(f"{where}: concurrency >= 1 and mean_service_s > 0")
    return pool


def _pool_set(pools: tuple[Pool, ...]) -> Pools:
    """The pools as a configuration would declare them: the same checks, the same routing."""
    try:
        return Pools({p.name: PoolSpec(name=p.name, kinds=p.kinds, concurrency=p.concurrency,
                                       mean_service_s=p.mean_service_s) for p in pools})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _pools(data: dict[str, Any]) -> tuple[Pool, ...]:
    """``[pool]`` (one pool, ``default``) or ``[pools.<name>]`` tables, ``default`` first."""
    if "pools" not in data:
        return (_pool(data.get("pool", {}), DEFAULT_POOL, "pool"),)
    if "pool" in data:
        raise ConfigError("pool and pools: a scenario has one [pool] or [pools.<name>] tables")
    tables = data["pools"]
    if not isinstance(tables, dict) or not 0 < len(tables) <= MAX_POOLS:
        raise ConfigError(f"pools: one [pools.<name>] table per pool, at most {MAX_POOLS}")
    pools = {name: _pool(table, name, f"pools.{name}") for name, table in tables.items()}
    return tuple(pools[name] for name in _pool_set(tuple(pools.values())).names
                 if name in pools)


def _place(streams: tuple[Stream, ...], pools: tuple[Pool, ...]) -> None:
    """Every stream's jobs run in a pool the scenario declares, the one their kind names."""
    names = [p.name for p in pools]
    owners = _pool_set(pools)
    for i, stream in enumerate(streams):
        owner = owners.pool_of(stream.kind) if stream.kind else None
        if stream.pool and owner and stream.pool != owner:
            raise ConfigError(f"streams[{i}]: kind {stream.kind!r} runs in pool {owner!r}, "
                              f"not {stream.pool!r}")
        lands = stream.pool or owner or DEFAULT_POOL
        if lands not in names:
            raise ConfigError(f"streams[{i}]: its jobs run in pool {lands!r}, which the "
                              f"scenario lacks (it has {', '.join(names)})")


def parse(data: dict[str, Any], name: str, source: Path | None) -> Scenario:
    """Validate a scenario's TOML mapping; ``ConfigError`` names the offending field."""
    pools = _pools(data)
    base = None if source is None else source.parent
    streams = tuple(_stream(s, i, base) for i, s in enumerate(data.get("streams", [])))
    if not streams:
        raise ConfigError(f"scenario {name!r} has no [[streams]]")
    _place(streams, pools)
    jobs = int(data.get("jobs", 100_000))
    if jobs < 1:
        raise ConfigError("jobs: at least 1")
    return Scenario(
        name=str(data.get("name", name)), description=str(data.get("description", "")),
        jobs=jobs, pools=pools, service=_service(dict(data.get("service", {})), "service"),
        streams=streams, source=source, kinds=kinds_from(data.get("kinds", {}),
                                                           _sent(streams)),
    )
