"""``RedisIndex``'s routing by kind (``jobs.index.worker_registry``): the waiting kinds, the
parked jobs, and the leader's upkeep that routes the pool or stops."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from jobs.index.redis_scripts import RedisScripts, now_arg, score_arg, text_of
from jobs.index.values import KindRoutes


class RedisKinds(RedisScripts):
    def kinds_waiting(self) -> frozenset[str]:
        return frozenset(text_of(kind) for kind in self._client.smembers(self._keys.kinds_waiting))

    def note_kinds_waiting(self, kinds: Iterable[str]) -> None:
        met = sorted(set(kinds))
        if not met:
            return
        pipe = self._client.pipeline(transaction=True)
        pipe.sadd(self._keys.kinds_waiting, *met)
        pipe.set(self._keys.routed, "1")
        pipe.execute()

    def park(
        self, job_id: str, *, attempt: int, kind: str, until: float, fence: str | None = None
    ) -> bool:
        if not kind:
            raise ValueError("a parked job names its kind")
        args = [job_id, str(int(attempt)), score_arg(until), fence or "", kind]
        return bool(self._run("put_back", args))

    def route_kinds(
        self,
        *,
        now: float | None = None,
        forget: Sequence[str] = (),
        unpark: Sequence[str] = (),
        fence: str | None = None,
    ) -> KindRoutes:
        raw = self._run("route_kinds", [now_arg(now), fence or "", len(forget), *forget,
                                        *unpark], self._keys.worker_keys())
        return KindRoutes(routed=bool(int(raw[0])),
                          waiting=frozenset(text_of(kind) for kind in raw[1:]))
