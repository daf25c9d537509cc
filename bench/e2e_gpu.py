"""The GPU-like run of the end-to-end bench: N jobs that each hold a slot, all at once, 4 slots.

Expensive work keeps a device busy for a while; what a scheduler must not do is leave the
device idle between one job and the next. Each system gets ``count`` jobs, submitted at
once from the client threads, whose handler holds its slot ``seconds`` (``start_mark.Hold``,
``bare.hold``) and records its start and end with ``time.time()`` on a Redis list: one host,
one clock. From those:

- makespan: from the first submit to the last end;
- utilisation: ``count × seconds / (slots × makespan)``, 1 for a scheduler that wastes
  nothing (and submits in no time);
- the gap between a job's end and the next start on the slot it freed. A slot is one of the
  worker's 4 units of capacity, not a thread: with the queue never empty, the k-th end frees
  the slot that the (k + 4)-th start fills (no more than 4 hold at once), so each gap is
  ``starts[k + 4] − ends[k]``: the time a freed slot stood empty.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Protocol

import redis


class HoldsSlots(Protocol):
    def hold_jobs(self, clients: int, count: int, key: str, seconds: float) -> float:
        """Submit ``count`` hold jobs (payload ``key``, ``seconds``); wait until all are done;
        when the first submit left (``time.time()``, once every client was built)."""
        ...


@dataclass(frozen=True, kw_only=True)
class HoldRun:
    makespan_s: float
    utilisation: float
    gaps_s: list[float]  # end → next start on the freed slot, one per handover
    most_at_once: int  # the most jobs holding at one time: the slots, if all is well


def hold_run(side: HoldsSlots, marks: redis.Redis, *, clients: int, count: int,
             seconds: float, slots: int) -> HoldRun:
    """Run ``count`` hold jobs on ``side`` and measure them."""
    key = f"bench:hold:{uuid.uuid4().hex}"
    try:
        submitted = side.hold_jobs(clients, count, key, seconds)
        raw: list[bytes] = marks.lrange(key, 0, -1)  # type: ignore[assignment]
    finally:
        marks.delete(key)
    spans = [tuple(float(x) for x in item.split()) for item in raw]
    if len(spans) != count:
        raise RuntimeError(f"{len(spans)} of {count} hold jobs recorded their slot time")
    return measured([(start, end) for start, end in spans], submitted=submitted,
                    seconds=seconds, slots=slots)


def measured(spans: list[tuple[float, float]], *, submitted: float, seconds: float,
             slots: int) -> HoldRun:
    starts = sorted(start for start, _ in spans)
    ends = sorted(end for _, end in spans)
    makespan = ends[-1] - submitted
    return HoldRun(
        makespan_s=makespan,
        utilisation=len(spans) * seconds / (slots * makespan),
        gaps_s=[starts[k + slots] - ends[k] for k in range(len(spans) - slots)],
        most_at_once=_most_at_once(spans),
    )


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    # An end sorts before a start at the same instant: a handover is not an overlap.
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most
