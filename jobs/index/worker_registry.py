"""The live workers and their slots: the part of the dispatch index that sizes the pool.
"""

from __future__ import annotations

from typing import Protocol

from jobs.index.values import LiveWorker


class WorkerRegistry(Protocol):
    """Workers register their slots with a TTL that their heartbeat renews; a registration
    that lapses takes its slots out of the pool."""

    def register_worker(
        self, worker_id: str, *, slots: int, ttl_s: float, now: float | None = None,
        device: str = "cpu", memory_bytes: int | None = None,
    ) -> None:
        """Record a live worker's slots, device and (on a GPU) its memory until ``now +
        ttl_s`` (its heartbeat renews it)."""
        ...

    def live_workers(self, *, now: float | None = None) -> list[LiveWorker]:
        """The workers whose registration has not expired at ``now``, by id."""
        ...

    def unregister_worker(self, worker_id: str) -> None:
        ...

    def pool_capacity(self, *, now: float | None = None) -> int:
        """Sum of the slots of workers whose registration has not expired at ``now``."""
        ...
