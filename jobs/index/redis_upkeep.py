"""``RedisIndex``'s upkeep: caps, leadership, the rebuild epoch and the reconciler's walks,
none on a hot path."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jobs.index.base import NotLeader
from jobs.index.redis_scripts import RedisScripts, check_caps, meta_attempt, text_of, ttl_ms
from jobs.index.values import Entry

# The walk's phases (scan_entries): meta, then at most this many tiers less one.
_PHASES = 1024
# Jobs an index of an earlier layout moves to this one per script call (upgrade_layout).
UPGRADE_CHUNK = 10_000


class RedisUpkeep(RedisScripts):
    """Caps, the leader lock, the generation sentinel and entry walks of ``RedisIndex``."""

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
        overrides = tenant_caps or {}
        check_caps(tier_caps, "tier")
        check_caps(overrides, "tenant")
        args: list[str | int] = [fence or "", len(tier_caps)]
        for caps in (tier_caps, overrides):
            for name, cap in caps.items():
                args += [name, int(cap)]
        self._run("set_caps", args)

    def job_ids(self) -> Iterator[str]:
        keys = self._keys
        tiers = [text_of(tier) for tier in self._client.hkeys(keys.tier_delayed)]
        for zset in (*(keys.tier(tier) for tier in tiers), keys.delayed, keys.leases):
            for member, _ in self._client.zscan_iter(zset, count=1000):
                yield text_of(member)

    def scan_entries(self, cursor: int, count: int) -> tuple[int, list[Entry]]:
        """The walk goes over ``meta`` (leases, delayed jobs, queued ones with meta), then
        each tier's zset (every queued job, those without meta among them): the cursor is
        a Redis cursor times ``_PHASES`` plus the phase (0: meta; n: the n-th tier by
        name). One step moves on through the phases until it holds ``count`` entries."""
        entries: list[Entry] = []
        while True:
            scan, phase = divmod(cursor, _PHASES)
            tiers = sorted(text_of(tier) for tier in self._client.hkeys(self._keys.tier_delayed))
            if phase > min(len(tiers), _PHASES - 1):
                return 0, entries
            step, found = (self._meta_step(scan, count) if phase == 0
                           else self._tier_step(tiers[phase - 1], scan, count))
            entries += found
            if step != 0:
                cursor = step * _PHASES + phase
            elif phase >= min(len(tiers), _PHASES - 1):
                return 0, entries  # the last tier walked: the walk is complete
            else:
                cursor = phase + 1
            if len(entries) >= count:
                return cursor, entries

    def _meta_step(self, scan: int, count: int) -> tuple[int, list[Entry]]:
        step, found = self._client.hscan(self._keys.meta, scan, count=count)
        pairs: dict[Any, Any] = dict(found) if isinstance(found, dict) else {}
        jobs = [(text_of(job), meta_attempt(json.loads(text_of(raw))))
                for job, raw in pairs.items()]
        pipe = self._client.pipeline(transaction=False)
        for job_id, _ in jobs:
            pipe.zscore(self._keys.leases, job_id)
        leased = pipe.execute() if jobs else []
        return int(step), [Entry(job_id=job_id, attempt=attempt, leased=lease is not None)
                           for (job_id, attempt), lease in zip(jobs, leased, strict=True)]

    def _tier_step(self, tier: str, scan: int, count: int) -> tuple[int, list[Entry]]:
        """Queued jobs of one tier; those with meta were met in the meta phase already."""
        step, members = self._client.zscan(self._keys.tier(tier), scan, count=count)
        ids = [text_of(member) for member, _ in members]
        metas = self._client.hmget(self._keys.meta, ids) if ids else []
        return int(step), [Entry(job_id=job_id, attempt=1, leased=False)
                           for job_id, meta in zip(ids, metas, strict=True) if meta is None]

    def entries_of(self, job_ids: Sequence[str]) -> dict[str, Entry]:
        if not job_ids:
            return {}
        raw = self._run("entries", list(job_ids))
        return {
            job_id: Entry(job_id=job_id, attempt=int(attempt), leased=bool(leased))
            for job_id, (attempt, leased) in zip(job_ids, raw, strict=True)
            if int(attempt) > 0
        }

    def clear(self) -> None:
        """Delete every key under the prefix (SCAN + UNLINK in batches: not a hot path).
        The Celery broker's queues share the prefix (kombu's ``global_keyprefix``) and go
        too: never call this while the system runs."""
        batch: list[Any] = []
        for key in self._client.scan_iter(match=self._keys.glob(), count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                self._client.unlink(*batch)
                batch = []
        if batch:
            self._client.unlink(*batch)

    # -- leadership and the rebuild sentinel --

    def acquire_leadership(self, owner: str, *, ttl_s: float, now: float) -> str | None:
        token = self._leadership["lead"](
            keys=self._keys.leader_keys(), args=[owner, ttl_ms(ttl_s)]
        )
        return None if not token else text_of(token)

    def renew_leadership(self, token: str, *, ttl_s: float, now: float) -> bool:
        return bool(
            self._leadership["renew_lead"](
                keys=self._keys.leader_keys(), args=[token, ttl_ms(ttl_s)]
            )
        )

    def resign_leadership(self, token: str, *, now: float) -> bool:
        return bool(self._leadership["resign"](keys=self._keys.leader_keys(), args=[token]))

    def leader(self, *, now: float) -> str | None:
        value = self._client.get(self._keys.leader)
        return None if value is None else text_of(value)

    def generation(self) -> str | None:
        value = self._client.get(self._keys.generation)
        return None if value is None else text_of(value)

    def upgrade_layout(self, *, fence: str | None = None) -> bool:
        upgraded, more = False, True
        while more:  # each call moves about UPGRADE_CHUNK jobs: none holds Redis for long
            done, left = self._run("upgrade_layout", [fence or "", UPGRADE_CHUNK])
            upgraded, more = upgraded or bool(done), bool(left)
        return upgraded

    def mark_generation(self, value: str) -> bool:
        return bool(self._client.set(self._keys.generation, value, nx=True))

    def set_generation(self, value: str | None, *, fence: str | None = None) -> None:
        keys = [self._keys.generation, self._keys.leader]
        if not self._set_generation(keys=keys, args=[value or "", fence or ""]):
            raise NotLeader("set_generation refused: the fencing token is not the leader's")
