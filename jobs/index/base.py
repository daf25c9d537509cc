"""The dispatch index seam: what the scheduler needs from Redis, as a Protocol.

Two implementations share one contract test suite (tests/integration/test_index_contract.py):
``RedisIndex`` (Lua scripts, the real thing) and ``MemoryIndex`` (an in-memory twin for the
simulator and model-based tests). Time is always passed in (``now``, epoch seconds); neither
implementation reads a host's clock: a ``now`` left out (None) is the index's own clock, Redis's
``TIME`` read inside the script (``RedisIndex``) or the twin's injected ``clock``, so that every
lease expiry, deadline and registration is decided on one clock whatever the callers' hosts
say. Tests and the simulator pass ``now`` to drive a virtual clock.

Leases belong to an attempt: every entry (queued job or lease) records the attempt it was
indexed with; ``renew`` and ``release`` name the attempt and touch nothing of another one,
and an entry of a later attempt is never replaced by an earlier one's ``requeue``.

Order: queued jobs are dispatched by ``order_key`` ascending, ties broken by job id (byte
order; job ids are time-ordered, so ties go in arrival order). A tenant at its cap keeps its
queued jobs and their keys; other tenants move ahead of it until it drops under its cap.

Leadership: several dispatchers may run; one holds the leader lock, whose value is a fencing
token. ``dispatch``, ``reap``, ``expire_due`` and every other leader write (the batch
feeder's ``admit`` among them) take the caller's token (``fence``) and, in the same atomic
step, refuse with ``NotLeader`` unless it is the lock's value: a deposed leader that has not
noticed yet changes nothing. The lock's TTL runs on Redis's clock in
``RedisIndex`` and on the ``now`` passed in by the twin.

The values it takes and returns live in ``values.py`` and are re-exported here; the worker
registrations and the leader lock are Protocols of their own (``worker_registry.py``,
``leader_lock.py``) that ``DispatchIndex`` extends.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from jobs.core.histograms import StartFigures
from jobs.index.leader_lock import LeaderLock, NotLeader
from jobs.index.values import (
    REFUSAL_BUCKET_S,
    REFUSALS_KEEP_S,
    Admission,
    AdmissionTerms,
    Admitted,
    Arrival,
    Entry,
    Finished,
    FirstRenewal,
    IndexedJob,
    KindRoutes,
    Lease,
    LiveWorker,
    MessagePush,
    Renewal,
    RunCandidate,
    TierDepth,
    TierPush,
    TierQueue,
    Work,
    refusal_minute,
)
from jobs.index.worker_registry import WorkerRegistry

__all__ = [
    "REFUSALS_KEEP_S",
    "REFUSAL_BUCKET_S",
    "Admission",
    "AdmissionTerms",
    "Admitted",
    "Arrival",
    "DispatchIndex",
    "Entry",
    "Finished",
    "FirstRenewal",
    "IndexedJob",
    "KindRoutes",
    "Lease",
    "LiveWorker",
    "MessagePush",
    "NotLeader",
    "Renewal",
    "RunCandidate",
    "TierDepth",
    "TierPush",
    "TierQueue",
    "Work",
    "refusal_minute",
]


class DispatchIndex(WorkerRegistry, LeaderLock, Protocol):
    """Queued jobs by order key, tenant caps, and in-flight leases; the live workers
    (``WorkerRegistry``) and the leader lock (``LeaderLock``) beside them."""

    def admit(
        self,
        job: IndexedJob,
        *,
        bound: int,
        tenant_quota: int | None = None,
        max_position: int | None = None,
        fence: str | None = None,
    ) -> Admitted:
        """Index ``job`` if its tier holds fewer than ``bound`` queued jobs (and its tenant
        fewer than ``tenant_quota``, and it would have at most ``max_position`` jobs ahead),
        as one atomic step; refuse otherwise, leaving nothing. Fenced as ``dispatch`` when
        the leader calls it (the batch feeder): a deposed leader's feeder admits nothing."""
        ...

    def admit_new(self, job: IndexedJob, terms: AdmissionTerms) -> Admission:
        """A submit's whole admission as one atomic step: take a token from the tenant's
        bucket, read the pool's figures, refuse a job its tenant's own cap would start after
        its ``max_wait_s``, then ``admit`` under the bound, quota and latest useful position
        that follow from the figures (``jobs.core.policy``). A refusal leaves nothing but the
        spent token and one more in the counts of its reason (``refusal_counts``) for its
        tier and its tenant, in the minute of ``terms.now``. ``job`` is a new job (attempt
        1, no ``not_before``)."""
        ...

    def refusal_counts(self, minutes: Sequence[int]) -> dict[tuple[str, str, str], int]:
        """The refusals ``admit_new`` counted in these minutes (``refusal_minute``; those
        older than ``REFUSALS_KEEP_S`` are gone), summed by ``(scope, name, reason)``:
        scope ``tier`` (name: the tier) or ``tenant`` (name: its id), reason as
        ``Admission.reason``."""
        ...

    def requeue(self, job: IndexedJob, *, fence: str | None = None) -> None:
        """Index an already accepted job again (reaped, retried, rebuilt): no bound check.
        Replaces an entry of an earlier attempt, or a queued entry of the same one; keeps a
        later attempt's entry and a lease of the same attempt (newer than the caller's read).
        Fenced as ``dispatch`` when a leader calls it."""
        ...

    def set_caps(
        self,
        tier_caps: Mapping[str, int],
        tenant_caps: Mapping[str, int] | None = None,
        *,
        fence: str | None = None,
    ) -> None:
        """Set the concurrency cap of each tier's tenants (and per-tenant overrides, which
        replace all earlier overrides). Tenants that are now under their cap become runnable.
        Fenced as ``dispatch``."""
        ...

    def requeue_many(self, jobs: Iterable[IndexedJob], *, fence: str | None = None) -> int:
        """``requeue`` each job, in atomic chunks (rebuilds); the number indexed."""
        ...

    def dispatch(
        self,
        n: int,
        *,
        lease_ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
        capacity: int | None = None,
    ) -> list[Lease]:
        """Pop up to ``n`` jobs in order-key order across runnable tenants, skipping tenants
        at their cap (they keep their place), and lease each until ``now + lease_ttl_s``.
        Jobs whose ``not_before`` is later than ``now`` wait; jobs past ``start_by`` are
        still returned (the caller expires them: the index does not know SQL). Each lease
        carries the ``start_by`` its entry was indexed with, so a job queued again from its
        lease alone (its row not visible yet) keeps its deadline. With a
        ``fence``, raise ``NotLeader`` (changing nothing) unless it is the leader's token.
        With a ``capacity``, ``n`` is cut to the slots it leaves free beside the leases
        held now (nothing when none is free), the capacity itself cut to the live workers'
        slots: a configured capacity admits work a pool with no live worker cannot start
        yet, and a lease taken into it would only lapse."""
        ...

    def renew(
        self, job_id: str, *, attempt: int, ttl_s: float, now: float | None = None
    ) -> bool:
        """Extend this attempt's lease to ``now + ttl_s`` (never shortening it); False when
        the lease is gone (reaped) or belongs to another attempt: the holder must stop."""
        ...

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
        """``renew``, also telling whether a cancel was requested for the job: a running job
        learns of a cancel with its renewals, never by reading SQL. ``announce``: publish
        that the job's status moved (``jobs.index.notify``) in the same round trip. ``start``: the
        worker's start: record its queue wait and dispatch latency (``jobs.index.counters``) with
        the renewal, when the lease is held. ``release``: first, in the same round trip,
        ``release`` the lease of an attempt whose ending is committed (announced and counted;
        the doorbell is not rung: the slot it held is this job's)."""
        ...

    def flag_cancel(self, job_id: str, *, attempt: int | None = None) -> bool:
        """Mark the lease of ``attempt`` (None: whichever holds it) as asked to cancel; the
        flag goes with the lease. False when no such lease is held."""
        ...

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
        """Drop a lease of ``attempt`` (None: whichever attempt holds it: maintenance of a
        finished job). True when its tenant became runnable again. ``ring``: wake the
        dispatcher in the same round trip when a lease was dropped (``jobs.index.wake``);
        ``ring_if_runnable``: only when a job is runnable too.
        ``announce``: publish that the job's status moved (``jobs.index.notify``), also in the
        same round trip. ``outcome``: the status the job just moved to, counted
        (``jobs.index.counters``) in the same round trip."""
        ...

    def hand_over(
        self,
        job_id: str,
        *,
        attempt: int,
        lease_ttl_s: float,
        capacity: int | None = None,
        now: float | None = None,
        announce: bool = False,
        outcome: str | None = None,
        take_next: bool = True,
        push: MessagePush | None = None,
        token: str | None = None,
        keep: bool = False,
        first: FirstRenewal | None = None,
    ) -> Lease | None:
        """A worker's slot passes on, in one step: ``release`` the lease of ``attempt`` (with
        ``announce`` and ``outcome`` as there), then, when the pool has a free slot, lease
        the best runnable job as ``dispatch`` would (order, caps, promotion) and return it.
        ``keep``: the lease of ``attempt`` stays, for the caller to ``release`` once its
        ending is committed; the next job is chosen as if it were released (its slot free,
        its tenant's lease not counted), and nothing is announced, counted or rung here.
        ``capacity``: the pool's slots (None: the live workers'). None leased (no runnable
        job or no free slot, or ``take_next`` False: a worker that is stopping): the
        dispatcher's doorbell rings instead. ``push``: the leased job's broker message,
        pushed in the same step (Redis only; the twin has no broker and refuses it), carrying
        ``token`` as its task's fourth argument when given. ``first``: the first renewal of
        ``attempt`` (``renew_checked``), not made yet, made just before, in the same round
        trip: the two steps each whole, in this order, though not one step."""
        ...

    def offer(
        self,
        *,
        lease_ttl_s: float,
        push: TierPush | None,
        capacity: int | None = None,
        now: float | None = None,
    ) -> Lease | None:
        """A submit's step after its commit: when the pool has a free slot (``capacity``
        cut to the live workers' slots, as ``dispatch`` cuts it; None: theirs), lease the
        best runnable job as ``dispatch`` would and push its message to its tier's queue
        (``push``), returning its lease. A free slot and
        nothing leased (nothing runnable, or no ``push``): the dispatcher's doorbell rings.
        No free slot: nothing happens (the next slot to free takes the best job itself)."""
        ...

    def tier_push(self) -> TierPush | None:
        """How ``offer`` pushes a message, as the workers published it (None: no worker
        whose broker is this Redis has)."""
        ...

    def set_tier_push(self, push: TierPush) -> None:
        """Publish how ``offer`` pushes a message (a worker, once it is ready)."""
        ...

    def put_back(
        self, job_id: str, *, attempt: int, not_before: float | None = None,
        fence: str | None = None,
    ) -> bool:
        """The lease of ``attempt`` goes back to the queue as its entry was indexed (order
        key, deadline), delayed until ``not_before``: a job whose row is not committed yet,
        or one whose publish failed. False when no lease of that attempt is held."""
        ...

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
        """Fill the run that job ``lead_id`` (``attempt``, whose lease is held) leads: lease,
        in the pool's order (order key, ties by id), the queued ``candidates`` (jobs of its
        kind) that may run now, until the run holds ``max_items`` items or ``max_cost``
        (None: no budget; the lead's own ``lead_cost`` counts first) would be passed. A
        candidate not queued here (delayed, leased, gone) is skipped; so is one whose tenant
        is at its cap, unless that tenant has an item in the run already: a tenant's items in
        one run hold one of its cap, and the run holds one slot of the pool (its riders take
        none). Returns the riders' leases in run order; none when the lead's lease is gone."""
        ...

    def renew_many(
        self,
        items: Sequence[tuple[str, int, StartFigures | None]],
        *,
        ttl_s: float,
        now: float | None = None,
        announce: bool = False,
    ) -> list[Renewal]:
        """``renew_checked`` of each ``(job, attempt, start figures)`` of a packed run, in one
        call (``announce``: each start, committed first, in one message)."""
        ...

    def release_many(self, items: Sequence[tuple[str, int, str | None]]) -> int:
        """Release each ``(job, attempt, status it moved to or None)`` of a packed run, in
        one call, counting and announcing each move; the number of leases dropped. Riders
        hold no slot: nothing rings."""
        ...

    def cancel(self, job_id: str, *, tenant: str | None = None, fence: str | None = None) -> bool:
        """Remove a queued job; False when it is not queued here. ``tenant``: the job's, as
        its row says; without it (a stray entry no row names) the index may have to search
        for it (``RedisIndex``: every tenant's queue), so callers that know it pass it."""
        ...

    def reap(
        self, *, now: float | None = None, limit: int = 1000, fence: str | None = None
    ) -> list[Lease]:
        """Remove and return leases that expired at or before ``now`` (oldest first), each
        with its ``start_by`` as ``dispatch`` returns it; fenced as ``dispatch``."""
        ...

    def expire_due(
        self, *, now: float | None = None, limit: int = 1000, fence: str | None = None
    ) -> list[IndexedJob]:
        """Remove and return queued jobs whose ``start_by`` is at or before ``now``; fenced
        as ``dispatch``."""
        ...

    def restore_lease(
        self,
        job: IndexedJob,
        *,
        ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
    ) -> bool:
        """Make an in-flight attempt (``job.attempt``, from SQL) hold a lease until at least
        ``now + ttl_s`` (a rebuild or a reconciler round): take one if the index does not
        know the job (it counts against its tenant's cap) or holds a stale entry of it (an
        earlier attempt, or a queued entry of this one); extend this attempt's lease if it
        ends sooner. An entry of a later attempt is newer than the caller's read: left
        alone, False. Fenced as ``dispatch``."""
        ...

    def job_ids(self) -> Iterator[str]:
        """Every job the index holds, queued, delayed or leased (in batches; an entry that
        moves during the walk may be seen twice). Maintenance only, never a hot path."""
        ...

    def scan_entries(self, cursor: int, count: int) -> tuple[int, list[Entry]]:
        """One bounded step of a walk over every entry: the entries and the cursor of the
        next step (0 when the walk is complete). An entry may be seen twice."""
        ...

    def entries_of(self, job_ids: Sequence[str]) -> dict[str, Entry]:
        """What the index holds for each of ``job_ids`` it knows (queued, delayed or leased)."""
        ...

    def now(self) -> float:
        """The index's clock (Redis ``TIME``), seconds since the epoch."""
        ...

    def position(self, job_id: str) -> int | None:
        """Queued jobs ahead of this one in order-key order (all tenants, all tiers)."""
        ...

    def position_at(self, order_key: float) -> int:
        """Queued jobs a new job with this order key would have ahead of it (ties count as
        ahead: a new job's id sorts after the ids already there)."""
        ...

    def runnable_ahead(self, job_id: str, order_key: float, *, limit: int) -> int:
        """Queued jobs at or below ``order_key`` that tenants below their caps can start on
        free slots (each runnable tenant's, up to what its cap leaves), ``job_id`` itself left
        out, counted to at most ``limit`` (the free slots). Fewer than the free slots: a job
        there starts at once, whatever waits on its tenant's cap ahead of it."""
        ...

    def places(
        self, jobs: Sequence[tuple[str, float]], *, free_slots: int
    ) -> dict[str, tuple[int, int]]:
        """``position`` and ``runnable_ahead`` (to at most ``free_slots``) of each queued
        ``(job_id, order_key)`` by id, for a page of jobs at once (one round trip on Redis);
        jobs not queued are left out."""
        ...

    def tier_depths(self, tiers: Sequence[str]) -> dict[str, TierDepth]:
        """Each tier's waiting jobs and its oldest queued one's order key (``TierDepth``)."""
        ...

    def depths_and_inflight(
        self, tiers: Sequence[str]
    ) -> tuple[dict[str, TierDepth], int]:
        """``tier_depths`` and ``inflight`` read at one instant: a job leased between two
        reads would be counted in neither (its queue read before, the leases after)."""
        ...

    def work(self) -> Work:
        """What the leader last published of the pool's work (``jobs.fleet.service_rate``):
        each tier's admissions (a tier with none absent) and the running jobs' mean; empty
        when nothing was published."""
        ...

    def inflight(self) -> int:
        """Leases held now, over all tenants."""
        ...

    def tenant_inflight(self, tenant: str) -> int:
        ...

    def inflight_by_tenant(self) -> dict[str, int]:
        """Leases held now, by tenant, as its cap counts them (a packed run's items of one
        tenant count once; tenants holding none are left out). Reads every lease: as many as
        the pool has slots and runs have items, not a walk of the queue."""
        ...

    def tenant_queued(self, tenant: str) -> int:
        ...

    def tenant_counts(self, tenant: str) -> tuple[int, int]:
        """``tenant_queued`` and ``tenant_inflight`` read at one instant: a job of the
        tenant leased between two reads would be counted in neither."""
        ...

    def clear(self) -> None:
        """Delete everything this index holds (tests, a fresh start). A rebuild from SQL
        does not clear (``jobs.dispatch.rebuild`` reconciles, so no concurrent submit is lost)."""
        ...
