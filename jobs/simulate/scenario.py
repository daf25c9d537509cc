"""Scenarios: the traffic a simulation replays, read from TOML.

A scenario names the pool (workers and their slots, and when workers join, leave or crash),
the service-time distribution, and the streams of arrivals per tier and tenant. The policy
(tiers, shares, bounds, ageing rate) is not part of it: that comes from the configuration,
so one scenario checks any configuration. The named scenarios ship in
``jobs/simulate/scenarios/``; any other file is read by path. A stream may replay a trace
(a CSV of ``time,tenant,tier,service_s``, relative to the scenario file).

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
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import MISSING, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from jobs.core.errors import ConfigError

DISTRIBUTIONS = ("fixed", "exponential", "lognormal")
PATTERNS = ("poisson", "diurnal", "burst", "trace")


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
    workers: int
    slots: int
    changes: tuple[PoolChange, ...] = ()


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
    service: ServiceTime | None = None  # None: the scenario's


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    description: str
    jobs: int
    pool: Pool
    service: ServiceTime
    streams: tuple[Stream, ...]
    source: Path | None = field(default=None, compare=False)

    def tiers(self) -> list[str]:
        return list(dict.fromkeys(stream.tier for stream in self.streams))


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
    return stream


def parse(data: dict[str, Any], name: str, source: Path | None) -> Scenario:
    """Validate a scenario's TOML mapping; ``ConfigError`` names the offending field."""
    pool_data = dict(data.get("pool", {}))
    changes = tuple(PoolChange(**_known(c, PoolChange, "pool.changes"))
                    for c in pool_data.pop("changes", []))
    pool = Pool(**_known(pool_data, Pool, "pool"), changes=changes)
    if pool.workers < 1 or pool.slots < 1:
        raise ConfigError("pool: workers >= 1 and slots >= 1")
    base = None if source is None else source.parent
    streams = tuple(_stream(s, i, base) for i, s in enumerate(data.get("streams", [])))
    if not streams:
        raise ConfigError(f"scenario {name!r} has no [[streams]]")
    jobs = int(data.get("jobs", 100_000))
    if jobs < 1:
        raise ConfigError("jobs: at least 1")
    return Scenario(
        name=str(data.get("name", name)), description=str(data.get("description", "")),
        jobs=jobs, pool=pool, service=_service(dict(data.get("service", {})), "service"),
        streams=streams, source=source,
    )
