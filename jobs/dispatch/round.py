"""What one dispatcher round did: the dispatcher and each of its chores add to it."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.dispatch.reconciler import ReconcileStats
from jobs.dispatch.retention import PruneStats


@dataclass
class DispatchStats:
    dispatched: int = 0
    expired: int = 0
    reaped: int = 0
    requeued: int = 0
    failed: int = 0
    dropped: int = 0
    # A dispatch call filled its whole batch: more may be runnable right away.
    batch_full: bool = False
    # Jobs whose publish failed (or that were not tried after a failure): handed back.
    publish_failed: int = 0
    # Jobs of a kind no live worker of their pool runs, parked (``jobs.dispatch.routing``).
    parked: int = 0
    # The round rebuilt the index from SQL instead (see ``lead_once``).
    rebuilt: bool = False
    # The reconciler's round, when one ran.
    reconciled: ReconcileStats | None = None
    # The retention round, when one ran.
    pruned: PruneStats | None = None
    # Batch items the feeder admitted to the live queue this round.
    fed: int = 0
    # Batch items are waiting: the next round should come within ``FEED_PERIOD_S``.
    feed_pending: bool = False

    @property
    def saturated(self) -> bool:
        """There may be more to do right away (otherwise a release or submit rings)."""
        return self.batch_full
