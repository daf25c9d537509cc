"""The batch feeder: admits waiting batch items into their tier's live queue as room allows.

Run by the leading dispatcher (``Dispatcher.run_once``, at most every ``FEED_PERIOD_S``).
Each round walks the batches that hold waiting items, oldest first, and for each admits its
next items one by one with the index's atomic ``admit`` under the tier's bound and the
tenant's queued quota, the same live figures a submit is admitted under (``jobs.fleet.pool``):
a batch can fill its own tenant's quota, never the tier, so other tenants' submits keep their
room and their wait. The first refusal ends that batch's turn. Admitted items then move
``waiting → queued`` in one UPDATE, with ``enqueued_at`` and the order key of the admission:
their ageing starts then, not at the upload.

Fenced as every other leader write: each ``admit`` carries the leader's token (refused in
the same atomic step once another dispatcher holds the lock), and the UPDATE's transaction
first checks that SQL still names this leader (``jobs.dispatch.recovery.check_lead``, which
holds the leadership row until it commits). A deposed leader's feeder thus indexes nothing
once another dispatcher holds the lock, and moves no row once one has named itself in SQL:
it raises ``NotLeader`` and the dispatcher steps down. Only the successor's UPDATE gives
an item its order key in SQL.

Commit point: the SQL UPDATE. Interrupted before it (a crash, or ``NotLeader`` at the lead
check), the index holds entries of rows still ``waiting``: such an entry is leased and
published like any other, and the worker's start, finding the row still waiting at its
attempt, releases the lease without running it (``stale``); the item is fed again later; fed
while the entry is still there, its ``admit`` is a duplicate, and the feeder requeues the
entry with this feed's order key (the one its UPDATE writes), so the index and SQL agree on
where the item stands. After it, a queued row the index lost is indexed again by the reconciler.
Everything the feeder needs is in SQL, so it survives restarts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from jobs.core.cadence import BATCHES_PER_ROUND, ITEMS_PER_ROUND
from jobs.dispatch.recovery import check_lead
from jobs.fleet import pool
from jobs.index import notify
from jobs.index.base import IndexedJob
from jobs.process.runtime import Runtime
from jobs.store import batches as repo
from jobs.store import tenants as tenants_sql

logger = logging.getLogger("tierq.batch_feeder")



@dataclass
class FeedStats:
    admitted: int = 0
    batches: int = 0


@dataclass
class BatchFeeder:
    runtime: Runtime
    # The last round found waiting items: the dispatcher comes back within a feed period
    # rather than sleeping until a ring, so a drained quota is refilled at once.
    pending: bool = False

    def run_once(self, now: float, *, fence: str | None = None) -> FeedStats:
        """One round, fenced by the leader's token (None: unfenced, a lone dispatcher);
        raises ``NotLeader`` once another dispatcher leads."""
        stats = FeedStats()
        with self.runtime.sessions() as session:
            batch_ids = repo.batches_with_waiting(session, limit=BATCHES_PER_ROUND,
                                                 scope=self.runtime.scope)
        self.pending = bool(batch_ids)
        if not batch_ids:
            return stats
        figures = pool.live_pool(self.runtime, now=now)
        full: set[str] = set()  # tenants (and tiers, as "tier:<name>") refused this round
        for batch_id in batch_ids:
            budget = ITEMS_PER_ROUND - stats.admitted
            if budget <= 0:
                break
            stats.batches += 1
            stats.admitted += self._feed(batch_id, figures, now, full, budget, fence)
        if stats.admitted:
            logger.info("batch.fed", extra={"event": "batch.fed", "count": stats.admitted,
                                            "batches": stats.batches})
        return stats

    def _feed(
        self, batch_id: str, figures: pool.PoolFigures, now: float, full: set[str],
        budget: int, fence: str | None,
    ) -> int:
        with self.runtime.sessions() as session:
            items = repo.next_waiting(session, batch_id, limit=budget)
            tenant = tenants_sql.get_tenant(session, items[0].tenant_id) if items else None
        start_by = items[0].start_by if items else None  # the batch's: its items share it
        if start_by is not None and start_by <= now:
            self._expire(batch_id, now, fence)
            return 0
        if not items or tenant is None or tenant.id in full or f"tier:{items[0].tier}" in full:
            return 0
        tier = items[0].tier
        if tier not in figures.bounds:  # a tier no longer served: its items stay waiting
            return 0
        bound = figures.bounds[tier]
        quota = tenant.max_queued if tenant.max_queued is not None else figures.quotas[tier]
        order_key = self.runtime.policy.order_key(tier, now)
        admitted: list[str] = []
        indexed_before: list[IndexedJob] = []
        for item in items:
            entry = IndexedJob(job_id=item.job_id, tenant=tenant.id, tier=tier,
                               order_key=order_key, start_by=item.start_by)
            outcome = self.runtime.index.admit(entry, bound=bound, tenant_quota=quota,
                                               fence=fence)
            if not outcome.accepted and not outcome.duplicate:
                full.add(tenant.id if outcome.reason == "tenant_limit" else f"tier:{tier}")
                break
            if outcome.duplicate:
                indexed_before.append(entry)
            admitted.append(item.job_id)
        if not admitted:
            return 0
        # An entry already there was left by a feed interrupted before its UPDATE (a crash,
        # or a leader deposed in between): it takes this feed's order key, the one SQL gets.
        self.runtime.index.requeue_many(indexed_before, fence=fence)
        with self.runtime.sessions.begin() as session:
            check_lead(session, fence)  # a successor's feeder decides these items, not this one
            moved = repo.admit_items(session, admitted, order_key=order_key, now=now)
        notify.announce_batches(self.runtime.redis, self.runtime.prefix, [batch_id])
        return moved

    def _expire(self, batch_id: str, now: float, fence: str | None) -> None:
        """The batch's completion window passed: its waiting items end expired, never run
        (fenced as the admits are)."""
        with self.runtime.sessions.begin() as session:
            check_lead(session, fence)
            expired = repo.expire_waiting(session, batch_id, now=now)
        notify.announce_batches(self.runtime.redis, self.runtime.prefix, [batch_id])
        logger.info("batch.items_expired", extra={"event": "batch.items_expired",
                                                  "batch_id": batch_id, "count": expired})
