"""A pool inside the engine: its contender (its own queue, bounds and caps), its workers, the
jobs running on its slots, and its own measure of the mean service time.

A scenario with pools (``jobs.core.pools``) runs one lane per pool: a job is queued, admitted
and started by its pool's contender only, on its pool's slots only, as each pool is a
dispatch index of its own in the real system.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from jobs.core.policy import WINDOW, MeasuredMean
from jobs.core.service_times import KindMean
from jobs.simulate.contender import Contender
from jobs.simulate.overtaking import Overtaking
from jobs.simulate.scenario import Pool


@dataclass(eq=False, kw_only=True)
class Lane:
    index: int  # in ``Traffic.pools``
    c: Contender
    pool: Pool
    tracker: Overtaking
    tenants: range | list[int]  # the tenants with jobs in this pool
    tenant_running: list[int]
    workers: dict[str, int] = field(default_factory=dict)
    capacity: int = 0
    busy: int = 0
    running: dict[int, tuple[int, float]] = field(default_factory=dict)  # job → (attempt, end)
    # Runs of more than one item: lead → its items (lead first, then its riders, with their
    # attempts); each rider → its run's lead.
    runs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    rider_of: dict[int, int] = field(default_factory=dict)
    run_times: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # newest first
    # Per kind (``Traffic.kinds``): its newest run times, and its jobs queued or running.
    kind_runs: dict[int, deque[float]] = field(default_factory=dict)
    live: dict[int, int] = field(default_factory=dict)
    # The last measure told its contender: the mean, each kind's, each measured kind's mean
    # and spread, the latest runs' overall mean.
    measure: tuple[MeasuredMean, dict[str, float], dict[str, KindMean],
                   float | None] | None = None
    # Each kind's measure once it has the runs a measure needs, and the latest runs' overall
    # mean (None: no runs).
    kinds: dict[str, KindMean] = field(default_factory=dict)
    overall: float | None = None
    kinds_at: int = -1  # completions behind ``kinds``
    completions: int = 0
    measured_at: int = 0  # completions behind the last measure
    busy_s: float = 0.0  # slot-seconds of work
    capacity_s: float = 0.0  # slot-seconds of pool


def lane_tenants(tenant: list[int], pool: bytearray, pools: int) -> list[list[int]]:
    """Per pool, the tenants that send it jobs."""
    seen: list[set[int]] = [set() for _ in range(pools)]
    for job, who in enumerate(tenant):
        seen[pool[job]].add(who)
    return [sorted(tenants) for tenants in seen]
