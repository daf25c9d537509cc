"""Packing: which queued items of one kind may share a slot's run, and how a run that fails
as a whole is split. Pure rules; the index forms runs (``fill_run``), the worker runs them
(``jobs.execution.packing``).

A run's first item is the job the slot would have started anyway; the rest follow it in the
pool's order. The rules here only say what may join and how large a run may be:

- ``max_items``: the kind's (the handler's ``max_items_per_run``, or the configuration's
  ``[kinds."<kind>"] max_items_per_run``); below 2 the kind does not pack;
- ``max_cost``: a budget in the handler's own units (``cost(payload)``: characters, tokens),
  which the first item always fits however large it is;
- ``run_cap``: a job's own bound, set when a run that held it failed as a whole: it runs
  again in runs of at most half that size, until the item that breaks the run runs alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Cost = Callable[[dict[str, Any]], int]


@dataclass(frozen=True, kw_only=True)
class Packing:
    """How a kind packs: at most ``max_items`` items per run, and at most ``max_cost`` of the
    handler's ``cost`` units (None: no budget)."""

    max_items: int
    max_cost: int | None = None
    cost: Cost | None = None

    def __post_init__(self) -> None:
        if self.max_items < 2:
            raise ValueError("a kind that packs runs at least 2 items per run")
        if self.max_cost is not None and self.max_cost < 1:
            raise ValueError("max_cost_per_run is at least 1")

    def cost_of(self, payload: dict[str, Any]) -> int:
        """An item's cost (0 without a budget): never negative."""
        if self.max_cost is None or self.cost is None:
            return 0
        return max(0, int(self.cost(payload)))


def run_size(max_items: int, lead_run_cap: int | None) -> int:
    """How many items the run a job leads may hold: the kind's bound, cut to the lead's own
    (a job split out of a failed run)."""
    return max(1, min(max_items, lead_run_cap if lead_run_cap is not None else max_items))


def may_join(run_cap: int | None, size: int) -> bool:
    """A job may join a run of up to ``size`` items unless a failed run bounded it below."""
    return run_cap is None or run_cap >= size


def split_cap(run_items: int) -> int:
    """The bound each item of a run of ``run_items`` that failed as a whole runs under next:
    half, rounded up, so every split makes progress and one item ends up alone."""
    return max(1, (run_items + 1) // 2)


def charged(run_items: int) -> bool:
    """A failure of the whole run charges its items only when the run held one item: that
    item is the one that breaks it."""
    return run_items <= 1
