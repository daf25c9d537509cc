"""``RedisIndex``'s upkeep: caps, leadership, the rebuild epoch and the reconciler's walks,
none on a hot path."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jobs.index.base import NotLeader
from jobs.index.redis_scripts import RedisScripts, check_caps, meta_attempt, text_of, ttl_ms
from jobs.index.values import Entry


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
        next_cursor, found = self._client.hscan(self._keys.meta, cursor, count=count)
        pairs: dict[Any, Any] = dict(found) if isinstance(found, dict) else {}
        metas = [(text_of(job), json.loads(text_of(raw))) for job, raw in pairs.items()]
        pipe = self._client.pipeline(transaction=False)
        for job_id, _ in metas:
            pipe.zscore(self._keys.leases, job_id)
        leased = pipe.execute() if metas else []
        entries = [
            Entry(job_id=job_id, attempt=meta_attempt(meta), leased=lease is not None)
            for (job_id, meta), lease in zip(metas, leased, strict=True)
        ]
        return int(next_cursor), entries

    def entries_of(self, job_ids: Sequence[str]) -> dict[str, Entry]:
        if not job_ids:
            return {}
        pipe = self._client.pipeline(transaction=True)
        for job_id in job_ids:
            pipe.zscore(self._keys.leases, job_id)
            pipe.hget(self._keys.meta, job_id)
        replies = pipe.execute()
        found: dict[str, Entry] = {}
        for i, job_id in enumerate(job_ids):
            lease, meta = replies[2 * i], replies[2 * i + 1]
            if meta is not None:
                attempt = meta_attempt(json.loads(text_of(meta)))
                found[job_id] = Entry(job_id=job_id, attempt=attempt, leased=lease is not None)
        return found

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
        return bool(self._run("upgrade_layout", [fence or ""]))

    def mark_generation(self, value: str) -> bool:
        return bool(self._client.set(self._keys.generation, value, nx=True))

    def set_generation(self, value: str | None, *, fence: str | None = None) -> None:
        keys = [self._keys.generation, self._keys.leader]
        if not self._set_generation(keys=keys, args=[value or "", fence or ""]):
            raise NotLeader("set_generation refused: the fencing token is not the leader's")
