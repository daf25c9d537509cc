"""A worker's registration in the index: its slots count towards the pool's capacity.

The registration is renewed every ``ttl / 3`` by a thread; a worker that dies stops renewing
and its slots drop out of ``pool_capacity`` when the registration expires. A clean stop
unregisters at once, so the dispatcher stops sending work to a worker that is leaving.

A worker names its device (``cuda:N`` or ``cpu``, ``workers.embedding.device``), on a GPU
its memory, and the kinds it runs when it registers (a pool whose workers run different
kinds is routed by kind: ``jobs.index.worker_registry``); unless told, a GPU worker takes
one slot (one job at a time fills the device with its batches) and a CPU worker
``CPU_SLOTS``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import redis

from jobs.core.policy import Policy
from jobs.index.base import DispatchIndex

logger = logging.getLogger("tierq.worker")

# A registration lives at least this long, so a short lease TTL cannot make it flap.
MIN_TTL_S = 3.0
# Default slots of a worker by its device, when --concurrency is not given.
GPU_SLOTS = 1
CPU_SLOTS = 2


def default_slots(device: str) -> int:
    """Jobs a worker on ``device`` runs at once unless told: what the device holds."""
    return GPU_SLOTS if device.startswith("cuda") else CPU_SLOTS


def registration_ttl_s(policy: Policy) -> float:
    return max(MIN_TTL_S, policy.lease_ttl_s)


class WorkerRegistration:
    """Registers ``slots`` for ``worker_id`` until ``stop``; ``register_once`` is one beat."""

    def __init__(
        self,
        index: DispatchIndex,
        *,
        worker_id: str,
        slots: int,
        ttl_s: float,
        device: str = "cpu",
        memory_bytes: int | None = None,
        kinds: Sequence[str] | None = None,
        on_register: Callable[[], None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.slots = slots
        self.device = device
        self.memory_bytes = memory_bytes
        self.kinds = None if kinds is None else sorted(kinds)
        self._index = index
        self._ttl_s = ttl_s
        self._on_register = on_register
        self._clock = clock
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(
            target=self._loop, name=f"registration-{worker_id}", daemon=True
        )

    def register_once(self) -> None:
        """Register until the index's clock + TTL (``clock``: a virtual one, in tests)."""
        now = None if self._clock is None else self._clock()
        self._index.register_worker(self.worker_id, slots=self.slots, ttl_s=self._ttl_s, now=now,
                                    device=self.device, memory_bytes=self.memory_bytes,
                                    kinds=self.kinds)

    def start(self) -> None:
        """Register now (new capacity: ring the dispatcher), then keep renewing."""
        self.register_once()
        logger.info(
            "worker.registered",
            extra={"event": "worker.registered", "worker_id": self.worker_id, "slots": self.slots,
                   "device": self.device, "memory_bytes": self.memory_bytes,
                   "kinds": None if self.kinds is None else ",".join(self.kinds)},
        )
        if self._on_register is not None:
            self._on_register()
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and unregister. Idempotent; a second caller waits for the first."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopping.set()
            if self._thread.is_alive():
                self._thread.join()
            self._unregister()
            self._stopped = True

    def _unregister(self) -> None:
        try:
            self._index.unregister_worker(self.worker_id)
        except redis.RedisError:
            logger.warning(
                "worker.unregister_failed",
                extra={"event": "worker.unregister_failed", "worker_id": self.worker_id},
                exc_info=True,
            )
            return
        logger.info(
            "worker.unregistered",
            extra={"event": "worker.unregistered", "worker_id": self.worker_id},
        )

    def _loop(self) -> None:
        while not self._stopping.wait(self._ttl_s / 3):
            try:
                self.register_once()
            except redis.RedisError:
                logger.warning(
                    "worker.register_failed",
                    extra={"event": "worker.register_failed", "worker_id": self.worker_id},
                    exc_info=True,
                )
