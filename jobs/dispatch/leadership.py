"""Leadership among dispatchers: one leads, the others stand by and take over when it dies.

The lock is the index's ``{prefix}leader`` key, held for ``leader_ttl_s`` and holding a
fencing token (``<epoch>:<owner>``; the epoch comes from ``INCR {prefix}leader_epoch`` at
each acquisition, the owner keeps tokens unique even after Redis lost the counter). The
leader renews it every ``ttl / 3``; a standby tries to take it every ``ttl / 3`` (at most a
second), so it leads within about ``ttl × 4/3`` of the leader's death, and within a second
of a clean resign.

Nothing here has to be perfectly timely to be safe. A leader that misses a renewal (a long
pause, a partition) may believe it leads while another does; but the token is checked
atomically where it matters: the index's ``dispatch``, ``reap`` and ``expire_due`` refuse a
token that is not the lock's (``NotLeader``), so a deposed leader hands out no lease and
reclaims none; and the SQL compare-and-set queued → dispatched on ``(status, attempt)``
succeeds once per attempt, so no job attempt is published twice. The decisions the reaper and
the reconciler take in SQL from a lease they found lapsed are fenced in SQL as well: a new
leader names its token in the ``leadership`` row first, and those transactions commit only
while it still names theirs (``docs/states.md``).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from dataclasses import dataclass, field

from jobs.index.base import DispatchIndex

logger = logging.getLogger("tierq.dispatcher")

MAX_RETRY_S = 1.0


def default_owner() -> str:
    """Who holds the lock, for people reading it: host, pid, and a random part."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


@dataclass
class Leadership:
    """This process's side of the leader lock; ``tick(now)`` once per loop turn."""

    index: DispatchIndex
    ttl_s: float
    owner: str = field(default_factory=default_owner)
    _token: str | None = field(default=None, init=False)
    _renewed_at: float = field(default=-math.inf, init=False)
    _said_standby: bool = field(default=False, init=False)

    @property
    def token(self) -> str | None:
        """The fencing token while this process leads, else None."""
        return self._token

    @property
    def renew_every_s(self) -> float:
        """A leader renews this often."""
        return self.ttl_s / 3

    @property
    def retry_every_s(self) -> float:
        """A standby tries to take the lock this often: within a third of the TTL after it
        lapses, and within a second after a resign, however long the TTL."""
        return min(self.ttl_s / 3, MAX_RETRY_S)

    @property
    def wait_s(self) -> float:
        """The longest a leader may sleep between turns and still renew in time."""
        return self.ttl_s / 6

    def tick(self, now: float) -> str | None:
        """Renew the lock when due (leader) or try to take it (standby); the token while
        leading. A renewal that fails steps down at once; the lock may then be taken
        straight back if it is free (Redis lost it)."""
        if self._token is not None:
            if now - self._renewed_at < self.renew_every_s:
                return self._token
            if self.index.renew_leadership(self._token, ttl_s=self.ttl_s, now=now):
                self._renewed_at = now
                return self._token
            self.step_down("renewal refused: the lock expired or another process holds it")
        return self._acquire(now)

    def _acquire(self, now: float) -> str | None:
        token = self.index.acquire_leadership(self.owner, ttl_s=self.ttl_s, now=now)
        if token is None:
            if not self._said_standby:
                self._said_standby = True
                self._say(logging.INFO, "dispatcher.standby", reason="another process leads")
            return None
        self._token, self._renewed_at, self._said_standby = token, now, False
        self._say(logging.INFO, "dispatcher.leading")
        return token

    def step_down(self, reason: str) -> None:
        """Stop leading at once (a refused renewal, a fenced call refused)."""
        if self._token is None:
            return
        self._say(logging.WARNING, "dispatcher.standby", reason=reason)
        self._token, self._said_standby = None, True

    def resign(self, now: float) -> bool:
        """Give the lock up (a clean shutdown), so a standby need not wait out the TTL.
        True when the lock was released."""
        token = self._token
        if token is None:
            return False
        self._token = None
        released = self.index.resign_leadership(token, now=now)
        self._say(logging.INFO, "dispatcher.resigned", token=token)
        return released

    def _say(self, level: int, event: str, **fields: str | None) -> None:
        extra = {"event": event, "owner": self.owner, "token": self._token, **fields}
        logger.log(level, event, extra=extra)
