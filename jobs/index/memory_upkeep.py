"""The twin's upkeep: caps, the rebuild epoch and the reconciler's walks, none on a hot path."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from jobs.index.memory_layout import MemoryLayout, check_caps
from jobs.index.values import Entry


class MemoryUpkeep(MemoryLayout):
    """Caps, the generation sentinel and entry walks of ``MemoryIndex``."""

    def set_caps(
        self,
        tier_caps: Mapping[str, int],
        tenant_caps: Mapping[str, int] | None = None,
        *,
        fence: str | None = None,
    ) -> None:
        """Merge ``tier_caps`` into the tier caps; replace all tenant overrides with
        ``tenant_caps`` (``None``: clear them). Blocked tenants now under their cap become
        runnable; runnable tenants over a lowered cap are blocked by the next dispatch."""
        self._check_fence(fence, None, "set_caps")
        overrides = dict(tenant_caps or {})
        check_caps(tier_caps, "tier")
        check_caps(overrides, "tenant")
        self._tier_caps.update({tier: int(cap) for tier, cap in tier_caps.items()})
        self._tenant_caps = {tenant: int(cap) for tenant, cap in overrides.items()}
        for job_id, score in self._blocked.items():
            if not self._at_cap(self._meta[job_id].tenant):
                self._blocked.remove(job_id)
                self._runnable.add(job_id, score)

    def job_ids(self) -> Iterator[str]:
        for zset in (self._queued, self._delayed):
            for job_id, _ in zset.items():
                yield job_id
        for _, job_id in sorted((at, job_id) for job_id, at in self._leases.items()):
            yield job_id

    def scan_entries(self, cursor: int, count: int) -> tuple[int, list[Entry]]:
        ids = sorted(self._meta)[cursor:cursor + count]
        entries = [
            Entry(job_id=job_id, attempt=self._meta[job_id].attempt,
                  leased=job_id in self._leases)
            for job_id in ids
        ]
        following = cursor + count
        return (following if following < len(self._meta) else 0), entries

    def entries_of(self, job_ids: Sequence[str]) -> dict[str, Entry]:
        return {
            job_id: Entry(job_id=job_id, attempt=self._meta[job_id].attempt,
                          leased=job_id in self._leases)
            for job_id in job_ids
            if job_id in self._meta
        }

    # -- the rebuild sentinel --

    def generation(self) -> str | None:
        return self._generation

    def upgrade_layout(self, *, fence: str | None = None) -> bool:
        self._check_fence(fence, None, "upgrade_layout")
        return False  # the twin's layout is this version's

    def mark_generation(self, value: str) -> bool:
        if self._generation is not None:
            return False
        self._generation = value
        return True

    def set_generation(self, value: str | None, *, fence: str | None = None) -> None:
        self._check_fence(fence, None, "set_generation")
        self._generation = value
