"""Retention: finished jobs and their results are pruned after their tier's period.

The hot tables stay small: a job that succeeded, failed, was cancelled or expired more than
``tiers.<name>.retention_s`` ago (0: kept forever) is deleted by the leading dispatcher's
upkeep, every ``PRUNE_PERIOD_S``, at most ``PRUNE_BATCH`` jobs per tier a round (sooner again
while a batch comes back full). Each batch is one transaction (``upkeep_sql.prune_finished``)
that deletes the rows, leaves a tombstone per job and adds to the tier's totals: it commits
whole or not at all, so an interruption leaves nothing to repair, and the next round takes
up what is still due. Pruning is SQL only: a finished job has nothing left in the index.

A tombstone keeps a pruned job's id and owner for one more retention period, so that its
owner is answered ``410 job_gone`` (status, result and cancel) instead of ``404``; another
tenant still gets ``404``, as for any id that is not theirs. Tombstones are pruned the same
way, so under a steady load both tables stay near ``rate x retention`` rows, whatever the
uptime. A batch goes once every one of its items is gone (``batches.prune_emptied``),
so the batches table stays bounded too; a batch's items are pruned one by one as they come
due, so the results of a long batch lose its oldest items first.

A succeeded job pruned before anybody fetched its result is **abandoned**: counted per tier
(``tierq_jobs_abandoned_total``) beside every prune (``tierq_jobs_pruned_total``), in SQL, in
the same transaction as the delete, so no crash loses or doubles a count.

Blobs go the same round: an uploaded document, or a result too large to keep inline, is
deleted once no job names it any more (its jobs were pruned) and a grace has passed since it
was stored (``jobs.blobs.records``), at most ``PRUNE_BLOBS_BATCH`` a round.

No fence is needed: a delete of what is due is the same whoever runs it, and two pruners
racing on a row delete and count it once (``DELETE ... RETURNING``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from jobs.blobs.records import PRUNE_BLOBS_BATCH, prune_blobs
from jobs.blobs.store import BlobStore
from jobs.core.cadence import PRUNE_BATCH
from jobs.core.policy import Policy, prune_before
from jobs.store import batches
from jobs.store import upkeep as upkeep_sql

logger = logging.getLogger("tierq.retention")



@dataclass
class PruneStats:
    # Per tier: jobs pruned, and of those, succeeded jobs whose result was never fetched.
    pruned: dict[str, int] = field(default_factory=dict)
    abandoned: dict[str, int] = field(default_factory=dict)
    tombstones: int = 0
    # Batches whose every item was pruned: they go too.
    batches: int = 0
    # Blobs no job names any more: deleted from the blob store.
    blobs: int = 0
    # A batch came back full: more is due now (the dispatcher prunes again next upkeep).
    more: bool = False

    @property
    def total(self) -> int:
        return sum(self.pruned.values())


@dataclass
class Retention:
    sessions: sessionmaker[Session]
    policy: Policy
    batch_size: int = PRUNE_BATCH
    # The blob store of documents and large results (None: blobs are not pruned here).
    blobs: BlobStore | None = None

    def run_once(self, now: float) -> PruneStats:
        """One bounded round: at most ``batch_size`` jobs and as many tombstones per tier."""
        stats = PruneStats()
        for name in sorted(self.policy.tiers):
            before = prune_before(self.policy.tiers[name], now)
            if before is None:
                continue
            self._prune_tier(name, before, now, stats)
        if self.blobs is not None:
            stats.blobs = prune_blobs(self.sessions, self.blobs, now=now)
            stats.more = stats.more or stats.blobs >= PRUNE_BLOBS_BATCH
        if stats.total or stats.tombstones or stats.batches or stats.blobs:
            logger.info("jobs.pruned", extra={
                "event": "jobs.pruned", "pruned": stats.total, "tombstones": stats.tombstones,
                "batches": stats.batches, "blobs": stats.blobs,
                "abandoned": sum(stats.abandoned.values()), "more": stats.more,
            })
        return stats

    def _prune_tier(self, tier: str, before: float, now: float, stats: PruneStats) -> None:
        with self.sessions.begin() as session:
            done = upkeep_sql.prune_finished(
                session, tier=tier, before=before, limit=self.batch_size, now=now
            )
        with self.sessions.begin() as session:
            # A tombstone lives one more retention period after its job was pruned.
            gone = upkeep_sql.prune_tombstones(
                session, tier=tier, before=before, limit=self.batch_size
            )
        with self.sessions.begin() as session:
            emptied = batches.prune_emptied(
                session, tier=tier, before=before, limit=self.batch_size
            )
        stats.batches += emptied
        if done.pruned:
            stats.pruned[tier] = done.pruned
            stats.abandoned[tier] = done.abandoned
        stats.tombstones += gone
        stats.more = stats.more or max(done.pruned, gone, emptied) >= self.batch_size
