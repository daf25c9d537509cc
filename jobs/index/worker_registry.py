"""The live workers, their slots and the kinds they run: the part of the dispatch index that
sizes the pool and says which worker may take which job.

Routing by kind. A pool whose live workers all registered the same kinds, and whose jobs
have shown no kind one of them does not run, is not *routed*: any of its workers takes any of
its jobs, and the submit's ``offer`` and a freed slot's ``hand_over`` lease as they always
did (the index knows no job's kind, and needs none). Once that no longer holds (a worker
with other kinds registers: a rolling deploy, a host without a package; or a worker meets a
job it has no handler for), the pool is routed: ``offer`` and ``hand_over`` lease nothing
and ring the dispatcher, which reads the kinds of what it leases and sends each job only to
workers that run its kind; a job of a kind no live worker runs is *parked*, put back delayed
(its place kept), until a worker that runs it registers. The leader's upkeep turns routing
off again once the workers agree (``route_kinds``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from jobs.index.values import KindRoutes, Lease, LiveWorker


class WorkerRegistry(Protocol):
    """Workers register their slots with a TTL that their heartbeat renews; a registration
    that lapses takes its slots out of the pool."""

    def register_worker(
        self, worker_id: str, *, slots: int, ttl_s: float, now: float | None = None,
        device: str = "cpu", memory_bytes: int | None = None,
        kinds: Iterable[str] | None = None,
    ) -> None:
        """Record a live worker's slots, device, (on a GPU) its memory and the kinds it runs
        (None: not said, taken as every kind) until ``now + ttl_s`` (its heartbeat renews
        it). Kinds unlike those the pool's other live workers registered route the pool."""
        ...

    def live_workers(self, *, now: float | None = None) -> list[LiveWorker]:
        """The workers whose registration has not expired at ``now``, by id."""
        ...

    def unregister_worker(self, worker_id: str) -> None:
        ...

    def pool_capacity(self, *, now: float | None = None) -> int:
        """Sum of the slots of workers whose registration has not expired at ``now``."""
        ...

    def kinds_waiting(self) -> frozenset[str]:
        """The kinds met that some live worker did not run, as the leader last left them
        (those no live worker runs wait: ``GET /v1/queues`` names them)."""
        ...

    def note_kinds_waiting(self, kinds: Iterable[str]) -> None:
        """A worker met jobs of ``kinds`` it has no handler for: route the pool by kind now
        (before that job goes back to the queue), and keep the kinds among those waiting."""
        ...

    def dispatch_routed(
        self,
        n: int,
        *,
        lease_ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
        capacity: int | None = None,
    ) -> tuple[list[Lease], bool]:
        """``dispatch``, and whether the pool is routed by kind: then the caller sends each
        lease only to workers that run its job's kind (or parks it), in the same round."""
        ...

    def park(
        self, job_id: str, *, attempt: int, kind: str, until: float, fence: str | None = None
    ) -> bool:
        """``put_back`` a lease of a job whose kind no live worker runs, due at ``until``,
        its place kept, noted as waiting for a worker of ``kind`` (``route_kinds`` brings it
        back at once when one registers). False when no lease of that attempt is held."""
        ...

    def route_kinds(
        self,
        *,
        now: float | None = None,
        forget: Sequence[str] = (),
        unpark: Sequence[str] = (),
        fence: str | None = None,
    ) -> KindRoutes:
        """The leader's upkeep: drop the waiting kinds ``forget`` (no job of theirs is left)
        with their parked jobs' notes; make the parked jobs of ``unpark`` (a live worker runs
        them now) due at once; then route the pool by kind, or stop, as its live workers'
        kinds and the waiting kinds say."""
        ...
