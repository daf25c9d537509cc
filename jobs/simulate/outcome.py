"""What a run of the engine leaves: every job's outcome and start, and the pool's use.

Kept apart from the engine so that the report reads them without the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Job outcomes (``Run.status``); HELD: a batch item the feeder has not admitted yet.
WAITING, SERVED, REFUSED, EXPIRED, FAILED, HELD = range(6)


@dataclass(frozen=True, kw_only=True)
class Sample:
    at_s: float
    queued: list[int]  # per tier
    busy: int
    capacity: int
    pools: tuple[tuple[int, int], ...] = ()  # per pool: (busy, capacity)


@dataclass(kw_only=True)
class Run:
    """What happened to every job under one contender."""

    policy: str
    horizon_s: float
    enqueued: list[float]  # arrival, or a batch item's admission by the feeder
    start: list[float]  # first start (nan: never started)
    status: bytearray
    refusal: list[str | None]  # "cause/limit" of a refused job
    # A refused job's (count, limit value) as the contender read them (see ``Verdict``).
    refusal_figures: dict[int, tuple[int | None, int | None]]
    told_wait_s: list[float | None]
    overtaken_wait_s: list[float]  # per tier, see jobs.simulate.overtaking
    overtaken_gap_s: list[float]
    peak: list[int]  # per tenant: most jobs running at once (in one pool)
    caps: list[int | None]  # per tenant, the largest cap it had (None: no cap)
    cap_exceeded: int  # starts that took a tenant over its cap
    restarts: int  # starts of a second or later attempt (retried or reaped)
    busy_s: float  # slot-seconds of work
    capacity_s: float  # slot-seconds of pool
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    # Per pool (``Traffic.pools``): slot-seconds of work and of pool.
    pool_busy_s: list[float] = field(default_factory=list)
    pool_capacity_s: list[float] = field(default_factory=list)
    # Per kind that packs: [runs started, items they held].
    run_items: dict[str, list[int]] = field(default_factory=dict)

    @property
    def utilisation(self) -> float:
        return self.busy_s / self.capacity_s if self.capacity_s else 0.0

    def pool_utilisation(self, pool: int) -> float:
        offered = self.pool_capacity_s[pool]
        return self.pool_busy_s[pool] / offered if offered else 0.0
