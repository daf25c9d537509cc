"""Recent refusals (429s) by tier, cause and limit, and by tenant, as the dashboard shows them.

The Prometheus counter of ``jobs.fleet.metrics`` only grows; the dashboard wants the last few
minutes, for every tier and every tenant. So the index counts each refusal in the same atomic
step that decides it (``DispatchIndex.admit_new``: no round trip more), by minute, for its
tier and for its tenant; this module sums the minutes of the window and names each reason as
the 429 does (``admission.cause_and_limit``): its cause (``capacity``: ours to fix;
``tenant_limit``: the client's) and the limit hit. Each pool's index counts the refusals of
its own submits (``jobs.core.pools``): the dashboard sums every pool's, so a 429 shows
whichever pool refused it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jobs.admission.refusals import cause_and_limit
from jobs.index.base import REFUSAL_BUCKET_S, DispatchIndex, refusal_minute

WINDOW_S = 300.0


@dataclass(frozen=True, kw_only=True)
class RefusalCount:
    """Refusals of one cause and limit (``capacity``/``bound``, ``tenant_limit``/``rate``…)."""

    cause: str
    limit: str
    count: int


@dataclass(frozen=True, kw_only=True)
class RecentRefusals:
    """The refusals of the window, by tier and by tenant id."""

    by_tier: dict[str, list[RefusalCount]]
    by_tenant: dict[str, list[RefusalCount]]

    def of_tier(self, tier: str) -> list[RefusalCount]:
        return self.by_tier.get(tier, [])

    def of_tenant(self, tenant_id: str) -> list[RefusalCount]:
        return self.by_tenant.get(tenant_id, [])


def window_minutes(now: float, window_s: float = WINDOW_S) -> list[int]:
    """The minutes of the window ending at ``now``, this one included."""
    last = refusal_minute(now)
    return list(range(last - int(window_s // REFUSAL_BUCKET_S) + 1, last + 1))


def read_recent(
    *indexes: DispatchIndex, now: float, window_s: float = WINDOW_S
) -> RecentRefusals:
    """The refusals of the window, summed over ``indexes`` (one per pool)."""
    minutes = window_minutes(now, window_s)
    return tally(*(index.refusal_counts(minutes) for index in indexes))


def tally(*counts: Mapping[tuple[str, str, str], int]) -> RecentRefusals:
    """Pure: the indexes' counts by (scope, name, reason), summed, as lists by tier and by
    tenant, each ordered by count (largest first), then cause and limit."""
    sums: dict[tuple[str, str, str, str], int] = {}
    for one in counts:
        for (scope, name, reason), count in one.items():
            cause, limit = cause_and_limit(reason)
            key = (scope, name, cause, limit)
            sums[key] = sums.get(key, 0) + count
    by_scope: dict[str, dict[str, list[RefusalCount]]] = {"tier": {}, "tenant": {}}
    for (scope, name, cause, limit), count in sums.items():
        if scope in by_scope:
            by_scope[scope].setdefault(name, []).append(
                RefusalCount(cause=cause, limit=limit, count=count))
    for lists in by_scope.values():
        for found in lists.values():
            found.sort(key=lambda c: (-c.count, c.cause, c.limit))
    return RecentRefusals(by_tier=by_scope["tier"], by_tenant=by_scope["tenant"])
