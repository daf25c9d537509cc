"""Blobs with a record in SQL: written so that pruning can never take one a job still needs.

A writer (an upload, a worker storing a large result) records the blob in SQL first, then
writes the bytes, then commits the job that names it (``jobs.blob`` or ``jobs.result_blob``).
The pruner takes, in one transaction, the blobs no job names that were last recorded more
than ``BLOB_GRACE_S`` ago, locks their rows, deletes their bytes and then their rows. A
writer's record waits for a pruner holding the row and then records it afresh, and a pruner
skips a row a writer has just recorded, so the bytes a new job names are always there.

Interrupted, each order leaves something the next round settles: a record without bytes or
a blob without a job is pruned after the grace; bytes deleted before their row was (the
pruner died) are deleted again, which is no error.
"""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from jobs.blobs.store import BlobStore, digest
from jobs.store import blobs as blobs_sql

# A blob no job names is kept this long after it was last stored: its job's commit may
# still be on its way (an upload's, or a worker's waiting out a database outage).
BLOB_GRACE_S = 3600.0
PRUNE_BLOBS_BATCH = 200


def store_blob(
    sessions: sessionmaker[Session], store: BlobStore, data: bytes, *, now: float
) -> str:
    """Record, then write ``data``; its sha256, for the job that will name it."""
    sha256 = digest(data)
    with sessions.begin() as session:
        blobs_sql.record_blob(session, sha256, size=len(data), now=now)
    store.put(data)
    return sha256


def prune_blobs(
    sessions: sessionmaker[Session], store: BlobStore, *, now: float,
    limit: int = PRUNE_BLOBS_BATCH, grace_s: float = BLOB_GRACE_S,
) -> int:
    """One bounded round: delete blobs no job names, past the grace; how many went."""
    with sessions.begin() as session:
        digests = blobs_sql.take_unreferenced_blobs(session, before=now - grace_s,
                                                     limit=limit)
        for sha256 in digests:
            store.delete(sha256)
        blobs_sql.forget_blobs(session, digests)
    return len(digests)
