"""A Redis sorted set in process memory, for the dispatch index's twin (``memory.py``).

Members with float scores, ordered like Redis orders them: ascending score, ties by member
bytes (code point order of a ``str`` is the byte order of its UTF-8).

Most of the twin's sets are small (a tenant's queue, its leases), and a plain sorted list
with ``bisect`` beats a ``SortedList`` several times there; a set that grows past
``SMALL`` moves to a ``SortedList`` so that the big ones (every queued job) stay O(log n).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from itertools import islice
from typing import Any

from sortedcontainers import SortedList

SMALL = 512


class ZSet:
    """A Redis sorted set: members with float scores, ordered by (score, member)."""

    __slots__ = ("_order", "_scores")

    def __init__(self) -> None:
        self._scores: dict[str, float] = {}
        # A sorted list while small, a SortedList once it has grown past SMALL.
        self._order: Any = []

    def __len__(self) -> int:
        return len(self._scores)

    def score(self, member: str) -> float | None:
        return self._scores.get(member)

    def _insert(self, item: tuple[float, str]) -> None:
        order = self._order
        if type(order) is list:
            insort(order, item)
            if len(order) > SMALL:
                self._order = SortedList(order)
        else:
            order.add(item)

    def _delete(self, item: tuple[float, str]) -> None:
        order = self._order
        if type(order) is list:
            del order[bisect_left(order, item)]
        else:
            order.remove(item)

    def add(self, member: str, score: float) -> None:
        old = self._scores.get(member)
        if old is not None:
            if old == score:
                return
            self._delete((old, member))
        self._scores[member] = score
        self._insert((score, member))

    def remove(self, member: str) -> bool:
        old = self._scores.pop(member, None)
        if old is None:
            return False
        self._delete((old, member))
        return True

    def first(self) -> tuple[str, float] | None:
        if not self._scores:
            return None
        score, member = self._order[0]
        return member, score

    def rank(self, member: str) -> int | None:
        score = self._scores.get(member)
        return None if score is None else self.rank_at(score, member)

    def rank_at(self, score: float, member: str) -> int:
        """Members ordered before (score, member)."""
        order = self._order
        if type(order) is list:
            return bisect_left(order, (score, member))
        return int(order.bisect_left((score, member)))

    def upto(self, score: float, limit: int) -> list[tuple[str, float]]:
        """Members with scores at or below ``score``, in order, at most ``limit``."""
        out: list[tuple[str, float]] = []
        order = self._order
        for each_score, member in (islice(order, limit) if type(order) is list
                                   else order.islice(0, limit)):
            if each_score > score:
                break
            out.append((member, each_score))
        return out

    def items(self) -> list[tuple[str, float]]:
        return [(member, score) for score, member in self._order]
