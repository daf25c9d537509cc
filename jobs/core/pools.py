"""Pools: which workers run which kinds, and where each pool's figures live.

A pool is a set of workers and the kinds they run (``[pools.<name>] kinds = [...]``); a kind
belongs to one pool, and ``default`` takes every kind no pool names. Each pool is a dispatch
index of its own under its own key prefix (``prefix``): its queues, leases, tier caps,
registered workers and measured service time, so its capacity, μ, bounds and caps are its
own and a flood in one pool never fills another's queue. What is the fleet's, not a pool's
(the leader lock, a tenant's request rate, tenant change hints), stays under the root prefix
(``jobs.index.keys``). The default pool's prefix is the root itself: a deployment without
pools is laid out exactly as one before pools.

Pure: names and sets only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_POOL = "default"
# Celery's execution pools, which ``tierq worker --pool`` also took before pools: no pool may
# be called so.
RESERVED = frozenset({"threads", "prefork", "solo"})
# A pool's name goes into Redis keys and broker queue names: lower-case, digits, '-', '_'.
POOL_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


@dataclass(frozen=True, kw_only=True)
class PoolSpec:
    """One configured pool: its kinds and, optionally, its own capacity and mean service
    time (None: the policy's ``pool_concurrency`` / ``mean_service_s``)."""

    name: str
    kinds: frozenset[str] = frozenset()
    concurrency: int | None = None
    mean_service_s: float | None = None


@dataclass(frozen=True)
class Pools:
    """Every pool of a deployment, ``default`` first."""

    specs: Mapping[str, PoolSpec] = field(default_factory=dict)
    _owner: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owner: dict[str, str] = {}
        for name, spec in self.specs.items():
            if not POOL_NAME.match(name):
                raise ValueError(f"pools.{name}: a pool name is lower-case letters, digits, "
                                 "'-' and '_', starting with a letter")
            if name in RESERVED:
                raise ValueError(f"pools.{name}: {name!r} names a Celery execution pool "
                                 "(--celery-pool); choose another name")
            if name == DEFAULT_POOL and spec.kinds:
                raise ValueError("pools.default: the default pool takes every kind no other "
                                 "pool names; it lists none")
            for kind in spec.kinds:
                if kind in owner:
                    raise ValueError(f"pools: kind {kind!r} is in both {owner[kind]!r} and "
                                     f"{name!r}; a kind belongs to one pool")
                owner[kind] = name
        object.__setattr__(self, "_owner", owner)

    @property
    def names(self) -> tuple[str, ...]:
        return (DEFAULT_POOL, *sorted(n for n in self.specs if n != DEFAULT_POOL))

    @property
    def pooled(self) -> bool:
        """Whether any pool besides ``default`` is configured."""
        return len(self.names) > 1

    def spec(self, name: str) -> PoolSpec:
        if name == DEFAULT_POOL:
            return self.specs.get(DEFAULT_POOL, PoolSpec(name=DEFAULT_POOL))
        try:
            return self.specs[name]
        except KeyError:
            raise ValueError(f"no pool {name!r}; configured: {', '.join(self.names)}") from None

    def pool_of(self, kind: str) -> str:
        return self._owner.get(kind, DEFAULT_POOL)

    def named_kinds(self) -> frozenset[str]:
        """The kinds some pool other than ``default`` names."""
        return frozenset(self._owner)

    def scope(self, name: str) -> KindScope:
        """The jobs of pool ``name`` by kind: for SQL reads that walk one pool's rows."""
        if not self.pooled:
            return KindScope()
        if name == DEFAULT_POOL:
            return KindScope(exclude=self.named_kinds())
        return KindScope(include=self.spec(name).kinds)

    def kinds_of(self, name: str, known: Iterable[str]) -> list[str]:
        """Of the ``known`` kinds (a worker's handlers), those pool ``name`` runs."""
        return sorted(kind for kind in known if self.pool_of(kind) == name)


@dataclass(frozen=True)
class KindScope:
    """Which kinds a read covers: ``include`` only those (when set), never ``exclude``.
    The empty scope covers every kind (one pool: no filter at all)."""

    include: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()

    @property
    def everything(self) -> bool:
        return self.include is None and not self.exclude

    def covers(self, kind: str) -> bool:
        if self.include is not None and kind not in self.include:
            return False
        return kind not in self.exclude


def pool_prefix(root: str, name: str) -> str:
    """The key prefix of pool ``name`` under ``root`` (same hash tag: one cluster slot)."""
    return root if name == DEFAULT_POOL else f"{root}pool:{name}:"
