"""The leader lock and the rebuild sentinel: the part of the dispatch index that decides who
leads and whether the index is whole (``base.py`` says how fencing works).
"""

from __future__ import annotations

from typing import Protocol

from jobs.core.errors import TierqError


class NotLeader(TierqError):
    """A fenced call whose token is not the leader lock's: the caller must stop leading."""


class LeaderLock(Protocol):
    """One dispatcher leads at a time, by a lock whose value is a fencing token; the
    generation sentinel says whether a leader has rebuilt the index since it lost its data."""

    def acquire_leadership(self, owner: str, *, ttl_s: float, now: float) -> str | None:
        """Take the leader lock for ``ttl_s`` if nobody holds it: the new fencing token
        (unique, and naming ``owner``), or None when it is held."""
        ...

    def renew_leadership(self, token: str, *, ttl_s: float, now: float) -> bool:
        """Extend the lock for ``ttl_s`` while it still holds ``token``; False: deposed."""
        ...

    def resign_leadership(self, token: str, *, now: float) -> bool:
        """Release the lock if it holds ``token`` (a standby may take it at once)."""
        ...

    def leader(self, *, now: float) -> str | None:
        """The token of the lock's holder, or None."""
        ...

    def generation(self) -> str | None:
        """The epoch (a sentinel the reconciler writes to SQL and here); None means the index
        lost its data since; an older value than SQL's, that it was restored from a snapshot."""
        ...

    def mark_generation(self, value: str) -> bool:
        """Set the sentinel unless it is set; True when this call set it."""
        ...

    def upgrade_layout(self, *, fence: str | None = None) -> bool:
        """Bring an index an earlier version wrote to this layout (a leader's full pass does,
        first); True when there was anything to do. Fenced as ``dispatch``."""
        ...

    def set_generation(self, value: str | None, *, fence: str | None = None) -> None:
        """Set the sentinel (the reconciler's epoch), or clear it (None: a rebuild of an index
        from an older snapshot begins); fenced as ``dispatch``. Without it the index is not
        whole: ``offer`` and ``hand_over`` lease nothing, since the leases of running jobs
        may be missing until a leader's rebuild puts them back."""
        ...
