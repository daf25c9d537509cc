"""What tierq's dispatcher reads to fill a run under simulation: per kind that packs, its
queued jobs in the pool's order (order key, ties by id), as ``fill_run``'s candidates.

The index decides which of them may join (queued now, their tenant's cap); this record only
has to hold every job of the kind that may be queued: one is added when admitted, fed or
requeued (a retry in its backoff too: ``fill_run`` skips it), and removed when it is leased
or expires.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from sortedcontainers import SortedList

from jobs.index.values import RunCandidate
from jobs.simulate.contender import Context

# (order key, job id, its candidate)
Entry = tuple[float, str, RunCandidate]


class Candidates(Sequence[RunCandidate]):
    """The queued jobs of one kind, in order: a view of the record, made at no cost per
    run (``fill_run`` reads as many as it needs)."""

    def __init__(self, queued: SortedList) -> None:
        self._queued = queued

    def __len__(self) -> int:
        return len(self._queued)

    @overload
    def __getitem__(self, i: int) -> RunCandidate: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[RunCandidate]: ...
    def __getitem__(self, i: int | slice) -> RunCandidate | Sequence[RunCandidate]:
        if isinstance(i, slice):
            return [entry[2] for entry in self._queued[i]]
        entry: Entry = self._queued[i]
        return entry[2]

    def __iter__(self) -> Iterator[RunCandidate]:
        return (entry[2] for entry in self._queued)


class QueuedByKind:
    """Per kind that packs (``Context.kinds``), its jobs that may be queued."""

    def __init__(self, context: Context, ids: list[str]) -> None:
        traffic = context.traffic
        self._kind = traffic.kind
        self._tenant = [traffic.tenants[t] for t in traffic.tenant] if context.packs else []
        self._ids = ids
        self._of_kind: dict[int, SortedList] = {
            kind: SortedList() for kind, each in enumerate(context.kinds) if each.packs}
        self._entries: dict[int, Entry] = {}

    def __bool__(self) -> bool:
        return bool(self._of_kind)

    def add(self, job: int, order_key: float) -> None:
        queued = self._of_kind.get(self._kind[job])
        if queued is not None and job not in self._entries:
            job_id = self._ids[job]
            entry = (order_key, job_id, RunCandidate(job_id=job_id, tenant=self._tenant[job]))
            self._entries[job] = entry
            queued.add(entry)

    def remove(self, job: int) -> None:
        entry = self._entries.pop(job, None)
        if entry is not None:
            self._of_kind[self._kind[job]].remove(entry)

    def of(self, job: int) -> Candidates:
        """The candidates of ``job``'s kind (one that packs)."""
        return Candidates(self._of_kind[self._kind[job]])
