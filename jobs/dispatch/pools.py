"""The leader of a fleet of pools: one ``Dispatcher`` per pool, under one leader lock.

Each pool is an index of its own (``jobs.core.pools``), so each has its own dispatcher: its
caps from its own capacity, its own reaper, expiry, feeder and reconciler, publishing to
its own tier queues. They share the leader lock and its fencing token, and run in one loop
(``jobs.dispatch.loop``), which sleeps on every pool's doorbell at once. Retention, which
deletes finished rows whatever their kind, is the default pool's dispatcher's alone.

A deployment of one pool runs its one ``Dispatcher`` directly, as before pools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from jobs.dispatch.dispatcher import Dispatcher, DispatchStats
from jobs.process.runtime import Runtime


@dataclass
class PoolDispatchers:
    """The loop's dispatcher for several pools: ``dispatchers[0]`` is the default pool's."""

    dispatchers: Sequence[Dispatcher]

    def __post_init__(self) -> None:
        for later in self.dispatchers[1:]:
            later.prunes = False

    @property
    def runtime(self) -> Runtime:
        return self.dispatchers[0].runtime

    @property
    def prefixes(self) -> list[str]:
        return [prefix for d in self.dispatchers for prefix in d.prefixes]

    @property
    def fence(self) -> str | None:
        return self.dispatchers[0].fence

    @fence.setter
    def fence(self, token: str | None) -> None:
        for dispatcher in self.dispatchers:
            dispatcher.fence = token

    @property
    def keep_lead(self) -> Callable[[], None] | None:
        return self.dispatchers[0].keep_lead

    @keep_lead.setter
    def keep_lead(self, renew: Callable[[], None] | None) -> None:
        for dispatcher in self.dispatchers:
            dispatcher.keep_lead = renew

    def needs_rebuild(self) -> bool:
        return any(d.needs_rebuild() for d in self.dispatchers)

    def rebuild(self, now: float) -> None:
        for dispatcher in self.dispatchers:
            if dispatcher.needs_rebuild():
                dispatcher.rebuild(now)

    def maintenance_due(self, now: float) -> bool:
        return any(d.maintenance_due(now) for d in self.dispatchers)

    def run_once(self, now: float, *, maintain: bool = True) -> DispatchStats:
        total = DispatchStats()
        for dispatcher in self.dispatchers:
            merge(total, dispatcher.run_once(now, maintain=maintain))
        return total


def merge(total: DispatchStats, part: DispatchStats) -> None:
    """Add one pool's round to the fleet's: counts add up, flags are any pool's."""
    for field in fields(DispatchStats):
        mine, theirs = getattr(total, field.name), getattr(part, field.name)
        if isinstance(mine, bool):
            setattr(total, field.name, mine or theirs)
        elif isinstance(mine, int):
            setattr(total, field.name, mine + theirs)
        elif mine is None:
            setattr(total, field.name, theirs)
