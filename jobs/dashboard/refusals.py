"""Recent refusals (429s) by tier, cause and limit, and by tenant, counted fleet-wide in Redis.

The Prometheus counter of ``jobs.metrics`` lives in each API process and only grows; the
dashboard wants the last few minutes over every replica. Each refusal adds one to two fields
of the hash of its minute (``IndexKeys.refusals``): one for its tier, one for its tenant. A
hash lives ``KEEP_S`` seconds; a read sums the buckets of the last ``WINDOW_S`` seconds.

The minute is taken from the runtime's clock (Redis's ``TIME``, ``jobs.clock``), so replicas
whose hosts disagree file a refusal under the same minute. Counting is best effort: a Redis
error here is logged and the refusal is answered as it would have been.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis

from jobs.index.keys import IndexKeys

logger = logging.getLogger(__name__)

BUCKET_S = 60
WINDOW_S = 300.0
KEEP_S = 600

_TIER = "tier"
_TENANT = "tenant"


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


def minute_of(now: float) -> int:
    return math.floor(now / BUCKET_S)


def _field(scope: str, name: str, cause: str, limit: str) -> str:
    return json.dumps([scope, name, cause, limit])


def record(
    client: redis.Redis, prefix: str, *, now: float, tier: str, tenant_id: str, cause: str,
    limit: str,
) -> None:
    """Count one refusal of ``tenant_id`` in ``tier`` (one round trip)."""
    key = IndexKeys(prefix).refusals(minute_of(now))
    try:
        pipe = client.pipeline(transaction=False)
        pipe.hincrby(key, _field(_TIER, tier, cause, limit), 1)
        pipe.hincrby(key, _field(_TENANT, tenant_id, cause, limit), 1)
        pipe.expire(key, KEEP_S)
        pipe.execute()
    except redis.RedisError:
        logger.warning("refusal.count_failed", exc_info=True,
                       extra={"event": "refusal.count_failed", "tier": tier})


def read_recent(client: redis.Redis, prefix: str, *, now: float) -> RecentRefusals:
    """The refusals of the last ``WINDOW_S`` seconds (whole minutes, this one included)."""
    keys = IndexKeys(prefix)
    last = minute_of(now)
    pipe = client.pipeline(transaction=False)
    for minute in range(last - int(WINDOW_S // BUCKET_S) + 1, last + 1):
        pipe.hgetall(keys.refusals(minute))
    return tally(pipe.execute())


def tally(buckets: Iterable[Mapping[bytes | str, bytes | str]]) -> RecentRefusals:
    """Pure: sum the buckets' fields into counts by tier and by tenant, each list ordered by
    count (largest first), then cause and limit."""
    sums: dict[tuple[str, str, str, str], int] = {}
    for bucket in buckets:
        for raw, value in bucket.items():
            field = raw.decode() if isinstance(raw, bytes) else raw
            scope, name, cause, limit = (str(part) for part in json.loads(field))
            key = (scope, name, cause, limit)
            sums[key] = sums.get(key, 0) + int(value)
    by_scope: dict[str, dict[str, list[RefusalCount]]] = {_TIER: {}, _TENANT: {}}
    for (scope, name, cause, limit), count in sums.items():
        if scope in by_scope:
            by_scope[scope].setdefault(name, []).append(
                RefusalCount(cause=cause, limit=limit, count=count))
    for lists in by_scope.values():
        for counts in lists.values():
            counts.sort(key=lambda c: (-c.count, c.cause, c.limit))
    return RecentRefusals(by_tier=by_scope[_TIER], by_tenant=by_scope[_TENANT])
