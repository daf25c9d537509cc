"""A brief, per-process memory of which tenant holds a key, so a request need not ask SQL.

Every request authenticates; without this, each one costs an SQL transaction. An entry
lives ``TTL_S`` seconds at most, and only while the process hears about tenant changes (its
``jobs.index.notify.Listener`` is subscribed): an admin change (new key, tier, limits) clears the
cache at once in the process that made it and, through a ``tenants`` notification, in every
other. A notification lost while the subscription stays up is bounded by the TTL; while the
subscription is down nothing is cached, so every request reads SQL as before.

Only keys that name a tenant are kept: unknown keys always go to SQL, so random keys can
neither grow the cache nor push real tenants out of it. A read that raced with an
invalidation (it began before the change and ends after the cache was cleared) is not
stored: ``put`` takes the generation seen before the read.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from jobs.core.domain import Tenant

TTL_S = 5.0
MAX_ENTRIES = 10_000


class TenantCache:
    def __init__(
        self,
        *,
        ttl_s: float = TTL_S,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, Tenant]] = OrderedDict()
        self._generation = 0
        self._live = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def generation(self) -> int:
        """Read before the SQL read whose answer goes to ``put``."""
        return self._generation

    def get(self, key_hash: str) -> Tenant | None:
        with self._lock:
            found = self._entries.get(key_hash)
            if found is None:
                return None
            expires_at, tenant = found
            if self._clock() >= expires_at:
                del self._entries[key_hash]
                return None
            return tenant

    def put(self, key_hash: str, tenant: Tenant, generation: int) -> bool:
        """Remember ``tenant`` unless the cache was cleared since ``generation`` was read or
        nobody would tell it of a change; the oldest entry makes room when full."""
        with self._lock:
            if not self._live or generation != self._generation:
                return False
            self._entries.pop(key_hash, None)
            self._entries[key_hash] = (self._clock() + self.ttl_s, tenant)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return True

    def invalidate(self) -> None:
        """Forget everything (admin changes are rare: no need to find the tenant's keys)."""
        with self._lock:
            self._entries.clear()
            self._generation += 1

    def set_live(self, live: bool) -> None:
        """Whether changes will be heard of; either way, what is held may be stale now."""
        with self._lock:
            self._live = live
            self._entries.clear()
            self._generation += 1
