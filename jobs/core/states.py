"""Job states and the one table of legal moves between them (drawn in docs/states.md).

Every change of a job's state is a compare-and-set on ``(status, attempt)`` that must be an
edge of ``TRANSITIONS``; the store refuses anything else before touching the database.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    WAITING = "waiting"  # a batch item stored but not yet admitted to its tier's live queue
    QUEUED = "queued"  # accepted, committed and indexed; waiting for a slot
    # Claimed in SQL before its publish: written by earlier versions only (a dispatch now
    # writes nothing to SQL, and the start moves a row from queued); still started, reaped
    # and recovered as before.
    DISPATCHED = "dispatched"
    RUNNING = "running"  # a worker holds the lease and runs the handler
    SUCCEEDED = "succeeded"  # terminal: the result is stored
    FAILED = "failed"  # terminal: non-retryable error, or attempts spent
    CANCELLED = "cancelled"  # terminal: cancelled before or (cooperatively) while running
    EXPIRED = "expired"  # terminal: not started within max_wait_s; never computed

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.EXPIRED})

TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    {
        # A batch item admitted by the feeder as room allows; its ageing starts then.
        (Status.WAITING, Status.QUEUED),
        (Status.WAITING, Status.CANCELLED),
        # Its batch's completion window passed before it was admitted.
        (Status.WAITING, Status.EXPIRED),
        (Status.QUEUED, Status.DISPATCHED),
        # A worker's start: the lease it was dispatched with is the claim.
        (Status.QUEUED, Status.RUNNING),
        (Status.QUEUED, Status.CANCELLED),
        (Status.QUEUED, Status.EXPIRED),
        # Reaped lease or a lost message: back to the queue with attempt + 1.
        (Status.DISPATCHED, Status.QUEUED),
        (Status.DISPATCHED, Status.RUNNING),
        (Status.DISPATCHED, Status.CANCELLED),
        # Checked again at worker start: work nobody will collect is not computed.
        (Status.DISPATCHED, Status.EXPIRED),
        # Attempts spent on a job whose worker keeps dying before it starts.
        (Status.DISPATCHED, Status.FAILED),
        (Status.RUNNING, Status.SUCCEEDED),
        (Status.RUNNING, Status.FAILED),
        (Status.RUNNING, Status.CANCELLED),
        # Retryable error or expired lease: back to the queue with attempt + 1.
        (Status.RUNNING, Status.QUEUED),
    }
)

# Moves that start a new attempt: the CAS bumps ``attempt`` by one.
NEW_ATTEMPT = frozenset({(Status.DISPATCHED, Status.QUEUED), (Status.RUNNING, Status.QUEUED)})


def is_legal(src: Status, dst: Status) -> bool:
    return (src, dst) in TRANSITIONS
