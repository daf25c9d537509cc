"""The twin's runs (``fill_run``): what ``lua/fill_run.lua`` does, step for step."""

from __future__ import annotations

from collections.abc import Sequence

from jobs.core.histograms import StartFigures
from jobs.index.memory_layout import frozen_value
from jobs.index.memory_leases import MemoryLeases
from jobs.index.values import Lease, Renewal, RunCandidate


class MemoryRuns(MemoryLeases):
    def renew_many(
        self,
        items: Sequence[tuple[str, int, StartFigures | None]],
        *,
        ttl_s: float,
        now: float | None = None,
        announce: bool = False,
    ) -> list[Renewal]:
        """The figures and announcements reach nobody here: the twin keeps no metrics."""
        return [self.renew_checked(job_id, attempt=attempt, ttl_s=ttl_s, now=now)
                for job_id, attempt, _ in items]

    def release_many(self, items: Sequence[tuple[str, int, str | None]]) -> int:
        dropped = 0
        for job_id, attempt, _ in items:
            held = job_id in self._leases and self._meta[job_id].attempt == attempt
            self.release(job_id, attempt=attempt)
            dropped += held
        return dropped

    def fill_run(
        self,
        lead_id: str,
        *,
        attempt: int,
        candidates: Sequence[RunCandidate],
        max_items: int,
        max_cost: int | None = None,
        lead_cost: int = 0,
        lease_ttl_s: float,
        now: float | None = None,
    ) -> list[Lease]:
        now = self._at(now)
        lead = self._meta.get(lead_id)
        if lead is None or lead_id not in self._leases or lead.attempt != attempt:
            return []
        expires_at = now + lease_ttl_s
        in_run, cost = {lead.tenant}, lead_cost
        found: list[tuple[float, str, RunCandidate]] = []
        for candidate in candidates:
            job = self._meta.get(candidate.job_id)
            key = self._queued.score(candidate.job_id)
            if job is not None and key is not None and job.tenant == candidate.tenant:
                found.append((key, candidate.job_id, candidate))
        found.sort(key=lambda f: (f[0], f[1].encode()))
        out: list[Lease] = []
        for _, job_id, candidate in found:
            if len(out) + 1 >= max_items:
                break
            if max_cost is not None and cost + candidate.cost > max_cost:
                break
            job = self._meta[job_id]
            tenant = job.tenant
            seat = tenant not in in_run
            if seat and self._at_cap(tenant):
                continue
            old = self._head_of(tenant)
            self._zrem(self._queues, tenant, job_id)
            self._queued.remove(job_id)
            self._drop(self._tiers, job.tier, job_id)
            if job.start_by is not None:
                self._deadlines.remove(job_id)
            self._leases[job_id] = expires_at
            self._riders.add(job_id)
            if seat:
                self._put(self._tenant_leases, tenant, job_id, expires_at)
                in_run.add(tenant)
            self._refile(tenant, old)
            cost += candidate.cost
            out.append(frozen_value(Lease, job_id=job_id, tenant=tenant, tier=job.tier,
                                    order_key=job.order_key, expires_at=expires_at,
                                    attempt=job.attempt, start_by=job.start_by))
        return out
