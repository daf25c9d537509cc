"""The twin's lease table and worker registry: what a running attempt and its worker touch."""

from __future__ import annotations

import math
from collections.abc import Iterable

from jobs.core.histograms import StartFigures
from jobs.index.memory_layout import MemoryLayout, check_scores
from jobs.index.values import (
    Finished,
    IndexedJob,
    Lease,
    LiveWorker,
    Renewal,
    Work,
    kinds_arg,
    kinds_of,
)


class MemoryLeases(MemoryLayout):
    """Leases (renew, release, reap, restore) and live workers of ``MemoryIndex``."""

    def renew(
        self, job_id: str, *, attempt: int, ttl_s: float, now: float | None = None
    ) -> bool:
        return bool(self.renew_checked(job_id, attempt=attempt, ttl_s=ttl_s, now=now))

    def renew_checked(
        self,
        job_id: str,
        *,
        attempt: int,
        ttl_s: float,
        now: float | None = None,
        announce: bool = False,
        start: StartFigures | None = None,
        release: Finished | None = None,
    ) -> Renewal:
        """``start`` records nothing here: the twin keeps no metrics."""
        if release is not None:
            self.release(release.job_id, attempt=release.attempt)
        current = self._leases.get(job_id)
        if current is None or self._meta[job_id].attempt != attempt:
            return Renewal.LOST
        expires_at = self._at(now) + ttl_s
        if expires_at > current:
            self._leases[job_id] = expires_at
            held = self._tenant_leases.get(self._meta[job_id].tenant, {})
            if job_id in held:  # a run's rider holds none of its tenant's cap but its first
                held[job_id] = expires_at
        return Renewal.CANCEL_REQUESTED if job_id in self._cancels else Renewal.HELD

    def flag_cancel(self, job_id: str, *, attempt: int | None = None) -> bool:
        if job_id not in self._leases:
            return False
        if attempt is not None and self._meta[job_id].attempt != attempt:
            return False
        self._cancels.add(job_id)
        return True

    def release(
        self,
        job_id: str,
        *,
        attempt: int | None = None,
        fence: str | None = None,
        ring: bool = False,
        announce: bool = False,
        outcome: str | None = None,
        ring_if_runnable: bool = False,
    ) -> bool:
        """``ring``, ``ring_if_runnable`` and ``announce`` reach nobody here: nothing waits
        on a twin; nor does ``outcome`` count anything (the twin keeps no metrics)."""
        self._check_fence(fence, None, "release")
        if job_id not in self._leases:
            return False
        if attempt is not None and self._meta[job_id].attempt != attempt:
            return False
        tenant = self._meta.pop(job_id).tenant
        self._cancels.discard(job_id)
        self._ending.discard(job_id)
        self._riders.discard(job_id)
        del self._leases[job_id]
        self._drop(self._tenant_leases, tenant, job_id)
        head = self._head_of(tenant)
        return head is not None and self._refile(tenant, head)

    def reap(
        self, *, now: float | None = None, limit: int = 1000, fence: str | None = None
    ) -> list[Lease]:
        if limit <= 0:
            return []
        now = self._at(now)
        self._check_fence(fence, now, "reap")
        out: list[Lease] = []
        for job_id, expires_at in self._lapsed(now, limit):
            job = self._meta[job_id]
            self._unindex(job)
            out.append(Lease(job_id=job_id, tenant=job.tenant, tier=job.tier,
                             order_key=job.order_key, expires_at=expires_at,
                             attempt=job.attempt, start_by=job.start_by))
        return out

    def restore_lease(
        self,
        job: IndexedJob,
        *,
        ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
    ) -> bool:
        check_scores(job)
        now = self._at(now)
        self._check_fence(fence, now, "restore_lease")
        job_id, expires_at = job.job_id, now + ttl_s
        known = self._meta.get(job_id)
        if known is not None:
            if known.attempt > job.attempt:
                return False
            current = self._leases.get(job_id)
            if known.attempt == job.attempt and current is not None:
                if current < expires_at:
                    self._leases[job_id] = expires_at
                    self._tenant_leases[known.tenant][job_id] = expires_at
                return True
            self._unindex(known)
        self._meta[job_id] = job
        self._cancels.discard(job_id)
        self._put(self._tenant_leases, job.tenant, job_id, expires_at)
        self._leases[job_id] = expires_at
        self._tenant_tier[job.tenant] = job.tier
        head = self._head_of(job.tenant)
        if head is not None:
            self._refile(job.tenant, head)
        return True

    def inflight_by_tenant(self) -> dict[str, int]:
        return {tenant: len(leases) for tenant, leases in self._tenant_leases.items() if leases}

    # -- the worker registry --

    def register_worker(
        self, worker_id: str, *, slots: int, ttl_s: float, now: float | None = None,
        device: str = "cpu", memory_bytes: int | None = None,
        kinds: Iterable[str] | None = None,
    ) -> None:
        expires_at = self._at(now) + ttl_s
        self._workers[worker_id] = (expires_at, int(slots))
        self._devices[worker_id] = (device or "cpu", memory_bytes)
        registered = self._worker_kinds[worker_id] = kinds_arg(kinds)
        if self._shared_kinds is None:
            self._shared_kinds = registered
        elif self._shared_kinds != registered:
            self._routed = True
        self._pool = None

    def unregister_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)
        self._devices.pop(worker_id, None)
        self._worker_kinds.pop(worker_id, None)
        self._pool = None

    def live_workers(self, *, now: float | None = None) -> list[LiveWorker]:
        self.pool_capacity(now=now)  # drops the expired ones
        return [LiveWorker(worker_id=worker, slots=slots, expires_at=expires_at,
                           device=self._devices.get(worker, ("cpu", None))[0],
                           memory_bytes=self._devices.get(worker, ("cpu", None))[1],
                           kinds=kinds_of(self._worker_kinds.get(worker, "")))
                for worker, (expires_at, slots) in sorted(self._workers.items())]

    def work(self) -> Work:
        return Work.parse(self.published_work, self.published_kinds)

    def pool_capacity(self, *, now: float | None = None) -> int:
        now = self._at(now)
        if self._pool is None or now >= self._pool[1]:
            self._workers = {w: entry for w, entry in self._workers.items() if entry[0] > now}
            if len(self._devices) > len(self._workers):
                self._devices = {w: d for w, d in self._devices.items() if w in self._workers}
                self._worker_kinds = {w: k for w, k in self._worker_kinds.items()
                                      if w in self._workers}
            # The sum, and when it next changes by itself (the first registration to lapse).
            self._pool = (sum(slots for _, slots in self._workers.values()),
                          min((entry[0] for entry in self._workers.values()), default=math.inf))
        return self._pool[0]
