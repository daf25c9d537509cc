"""Routing by kind: where a leased job goes while its pool's live workers do not all run every
kind its jobs may have (``jobs.index.worker_registry``: a rolling deploy, a host without a
package).

A pool whose live workers agree on their kinds is not routed: a dispatch publishes each lease
to its tier's queue, which every worker of the pool consumes, and reads nothing more (the
common case costs nothing here). A routed pool's dispatch (``dispatch_routed`` says it is)
reads the kinds of what it leased (one SQL read of ids and kinds per round) and the live
workers' kinds (one Redis read), and sends each job by its kind:

- a kind every live worker runs: its tier's queue, as ever;
- a kind some live worker runs: the kind's own queue (``kind.<kind>``), which only the
  workers that run it consume;
- a kind no live worker runs: parked (``index.park``), put back delayed by ``PARKED_S``, its
  place, attempt and deadline kept, nothing charged; ``Kinds`` brings it back at once when a
  worker of its kind registers, and ``GET /v1/queues`` names the kind and its waiting jobs;
- a job whose row is not visible yet (the submit that rang the dispatcher commits a moment
  after its offer): put back, its place kept, due again after ``UNCOMMITTED_RETRY_S``, when
  its kind can be read; one past the grace of an uncommitted submit (a failed submit's
  leftover) goes to its tier's queue, where the worker's start releases it.

Meanwhile the submits' ``offer`` and the freed slots' ``hand_over`` lease nothing (they cannot
tell a job's kind) and ring the dispatcher. A job that reaches a worker without its kind all
the same (a message sent before the pool was routed) goes back uncharged and routes the pool
(``jobs.execution.unstarted``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from jobs.core.cadence import MAINTENANCE_PERIOD_S
from jobs.core.ids import may_be_uncommitted
from jobs.core.states import Status
from jobs.dispatch.round import DispatchStats
from jobs.dispatch.upkeep import Chore
from jobs.index.base import Lease, LiveWorker
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql

logger = logging.getLogger("tierq.dispatcher")

# A job of a kind no live worker runs is tried again this long after it was parked, should
# the leader's word that a worker of its kind registered not have reached it.
PARKED_S = 30.0
# A routed round leases again into the slots its parked jobs left, at most this many times:
# jobs behind a run of parked ones are not left for the next round.
ROUTED_PASSES = 8
# The live states a waiting kind's jobs may be in: none left, it is forgotten.
LIVE = (Status.QUEUED, Status.DISPATCHED, Status.RUNNING)


@dataclass(frozen=True)
class Send:
    """A leased job to publish: to its tier's queue (``kind`` None) or to its kind's."""

    lease: Lease
    kind: str | None = None


@dataclass(frozen=True)
class Routed:
    sends: list[Send]
    parked: list[tuple[Lease, str]]
    # Leases of rows not visible yet, whose kind is not known: to put back for a moment.
    unread: list[Lease]


def route(runtime: Runtime, leases: Sequence[Lease], now: float) -> Routed:
    """Where each of ``leases`` goes, in dispatch order, by its job's kind and the kinds the
    pool's live workers run (see the module docstring)."""
    if not leases:
        return Routed(sends=[], parked=[], unread=[])
    with runtime.sessions() as session:
        kinds = jobs_sql.kinds_of(session, (lease.job_id for lease in leases))
    workers = runtime.index.live_workers(now=now)
    sends: list[Send] = []
    parked: list[tuple[Lease, str]] = []
    unread: list[Lease] = []
    for lease in leases:
        kind = kinds.get(lease.job_id)
        if kind is None and may_be_uncommitted(lease.job_id, now):
            unread.append(lease)
            continue
        runners = [] if kind is None else [w for w in workers if w.runs(kind)]
        if kind is None or len(runners) == len(workers):
            sends.append(Send(lease))
        elif runners:
            sends.append(Send(lease, kind))
        else:
            parked.append((lease, kind))
    return Routed(sends=sends, parked=parked, unread=unread)


def runs_somewhere(kind: str, workers: Sequence[LiveWorker]) -> bool:
    return any(worker.runs(kind) for worker in workers)


@dataclass
class Kinds(Chore):
    """The leader's upkeep of routing by kind (``index.route_kinds``): the parked jobs of a
    kind a live worker runs now come back to their places at once; a waiting kind none of
    whose jobs is live any more is forgotten; the pool is routed while its live workers'
    kinds differ or a waiting kind is one some live worker does not run, and no longer once
    they agree. One Redis call a period; SQL and a second call only while kinds wait."""

    period_s: float = MAINTENANCE_PERIOD_S

    def run_once(self, now: float, stats: DispatchStats) -> None:
        runtime, fence = self.lead.runtime, self.lead.fence
        routes = runtime.index.route_kinds(now=now, fence=fence)
        if not routes.waiting:
            return
        with runtime.sessions() as session:
            left = jobs_sql.count_by_kind(session, routes.waiting, LIVE)
        workers = runtime.index.live_workers(now=now)
        forget = sorted(kind for kind in routes.waiting if not left.get(kind))
        unpark = sorted(kind for kind in routes.waiting
                        if left.get(kind) and runs_somewhere(kind, workers))
        if forget or unpark:
            runtime.index.route_kinds(now=now, forget=forget, unpark=unpark, fence=fence)
            if unpark:
                logger.info("kinds.unparked", extra={"event": "kinds.unparked",
                                                     "kinds": ",".join(unpark)})
