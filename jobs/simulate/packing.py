"""Packing under simulation: how a kind's runs take time, and which queued items join a run.

A scenario may give a kind a run-time model (``[kinds."<kind>"] run_time = {a, b}``: a run of
``n`` items takes about ``a + b × n`` seconds) and a ``max_items_per_run``. A slot's first item
is the job the policy picks anyway; a kind that packs fills the run with the next queued jobs
of that kind in the policy's order (``fill``), as the index's ``fill_run`` does for tierq.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from jobs.core.errors import ConfigError

Job = TypeVar("Job")
Tenant = TypeVar("Tenant", bound=Hashable)


@dataclass(frozen=True, kw_only=True)
class RunTime:
    """A run of ``n`` items of a kind takes about ``a + b × n`` seconds: one forward pass,
    whose fixed cost ``a`` its items share."""

    a: float
    b: float

    def seconds(self, items: int) -> float:
        return self.a + self.b * items

    def stretch(self, items: int) -> float:
        """How much longer a run of ``items`` takes than a run of one."""
        return self.seconds(items) / self.seconds(1)


@dataclass(frozen=True, kw_only=True)
class Kind:
    """How a kind runs: at most ``max_items_per_run`` items per run (1: it does not pack), a
    run's time by ``run_time`` (None: each job its own draw)."""

    max_items_per_run: int = 1
    run_time: RunTime | None = None

    @property
    def packs(self) -> bool:
        return self.max_items_per_run > 1


NO_PACKING = Kind()


def fill(lead_tenant: Tenant, candidates: Iterable[tuple[Job, Tenant]], max_items: int,
         has_room: Callable[[Tenant], bool]) -> list[Job]:
    """The riders of a run whose first item is of ``lead_tenant``: the ``candidates`` (queued
    jobs of its kind, in the policy's order) that may join, until the run holds ``max_items``.
    A tenant with an item in the run already rides free (its items in one run hold one unit
    of its cap); another joins only while ``has_room`` (under its cap before the run), and
    then holds one unit."""
    inside = {lead_tenant}
    riders: list[Job] = []
    for job, tenant in candidates:
        if len(riders) + 1 >= max_items:
            break
        if tenant in inside:
            riders.append(job)
        elif has_room(tenant):
            inside.add(tenant)
            riders.append(job)
    return riders


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(name: str, table: Any) -> Kind:
    where = f"kinds.{name}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: a table of max_items_per_run, run_time")
    unknown = sorted(set(table) - {"max_items_per_run", "run_time"})
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    items = table.get("max_items_per_run", 1)
    if not isinstance(items, int) or isinstance(items, bool) or items < 1:
        raise ConfigError(f"{where}.max_items_per_run: a whole number, at least 1")
    run_time = None
    if "run_time" in table:
        model = table["run_time"]
        if (not isinstance(model, dict) or set(model) != {"a", "b"}
                or not all(_number(v) for v in model.values())):
            raise ConfigError(f"{where}.run_time: {{a = seconds, b = seconds per item}}")
        run_time = RunTime(a=float(model["a"]), b=float(model["b"]))
        if run_time.a < 0 or run_time.b < 0 or run_time.seconds(1) <= 0:
            raise ConfigError(f"{where}.run_time: a >= 0, b >= 0 and a + b > 0")
    kind = Kind(max_items_per_run=items, run_time=run_time)
    if kind.packs and run_time is None:
        raise ConfigError(f"{where}: a kind that packs needs its run_time = {{a, b}}")
    return kind


def kinds_from(data: Any, sent: set[str]) -> dict[str, Kind]:
    """A scenario's ``[kinds."<kind>"]`` tables; each names a kind some stream sends."""
    if not isinstance(data, dict):
        raise ConfigError('kinds: one [kinds."<kind>"] table per kind')
    for name in data:
        if name not in sent:
            raise ConfigError(f"kinds.{name}: no stream sends kind {name!r}")
    return {name: _kind(name, table) for name, table in data.items()}


def with_max_items(kinds: dict[str, Kind], max_items: dict[str, int],
                   sent: set[str]) -> dict[str, Kind]:
    """``kinds`` with these kinds' ``max_items_per_run`` (``tierq simulate --packing``); a
    kind that packs needs its run-time model from the scenario."""
    out = dict(kinds)
    for name, items in max_items.items():
        if name not in sent:
            raise ConfigError(f"--packing {name}: no stream of the scenario sends kind "
                              f"{name!r}")
        if items < 1:
            raise ConfigError(f"--packing {name}={items}: at least 1 item per run")
        kind = out.get(name, NO_PACKING)
        if items > 1 and kind.run_time is None:
            raise ConfigError(f"--packing {name}: the scenario gives kind {name!r} no run "
                              f'time: add [kinds."{name}"] run_time = {{a = ..., b = ...}}')
        out[name] = dataclasses.replace(kind, max_items_per_run=items)
    return out
