"""One clock for the whole fleet: Redis's.

Hosts' clocks disagree (an API or worker minutes behind is common enough), and a scheduler
that compares times written by different hosts reaps live leases early or ages jobs wrong.
So every time tierq writes or compares — order keys, ``start_by``, retry ``not_before``, the
rows' timestamps, rate buckets — is Redis's ``TIME``: inside the Lua scripts where a lease or
a deadline is decided, and through ``ServerClock`` everywhere else.

``ServerClock`` reads ``TIME`` once every ``resync_s`` and extrapolates with
``time.monotonic()`` in between, so a read costs no round trip and never follows the host's
wall clock (an NTP step, a skewed host). One caller at a time measures; the others read the
last offset meanwhile and never wait on Redis (an outage must not stall every thread that
asks the time). Until Redis has answered once it falls back to the host's clock, the only
one there is.

A reading is only as good as its round trip: the server read its clock somewhere within it,
so the offset is known to half the round trip. A reading taken while the host is loaded (a
30 ms round trip) would put every timestamp 15 ms off until the next one, so, as NTP's clock
filter does, a reading replaces the offset in use only when it is at least as certain (the
older one's uncertainty grows with its age, ``DRIFT`` a second) or when the two cannot both
be right: the server's clock moved (a failover to another host), and the new one is the
truth.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

# How often the offset to Redis's clock is measured again.
RESYNC_S = 10.0
# After a failed read, wait this long before trying again (Redis down: do not hammer it).
RETRY_S = 1.0
# How fast an offset grows uncertain, in seconds a second: a monotonic clock's drift against
# the server's, with room to spare (quartz drifts by tens of parts per million).
DRIFT = 1e-4


class ServerClock:
    """A callable clock: Redis's time, in seconds since the epoch."""

    def __init__(
        self,
        read_server: Callable[[], float],
        *,
        resync_s: float = RESYNC_S,
        monotonic: Callable[[], float] = time.monotonic,
        fallback: Callable[[], float] = time.time,
    ) -> None:
        self._read_server = read_server
        self._resync_s = resync_s
        self._monotonic = monotonic
        self._fallback = fallback
        self._offset: float | None = None
        self._uncertainty = float("inf")  # half the round trip of the reading in use
        self._measured_at = -float("inf")  # monotonic time of that reading
        self._next_sync = -float("inf")
        self._lock = threading.Lock()

    @property
    def synced(self) -> bool:
        """Redis has answered at least once: the time is Redis's, not the host's."""
        return self._offset is not None

    def __call__(self) -> float:
        if self._monotonic() >= self._next_sync:
            self._sync()
        offset = self._offset
        if offset is None:
            return self._fallback()
        return self._monotonic() + offset

    def _sync(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # another thread is measuring: use the last offset
        try:
            if self._monotonic() < self._next_sync:
                return  # another thread synced meanwhile
            before = self._monotonic()
            try:
                server = self._read_server()
            except (redis.RedisError, OSError):
                self._next_sync = self._monotonic() + RETRY_S
                return
            after = self._monotonic()
            # The server read its clock somewhere in [before, after]: take the middle.
            self._adopt(server - (before + after) / 2, (after - before) / 2, after)
            self._next_sync = after + self._resync_s
        finally:
            self._lock.release()

    def _adopt(self, offset: float, uncertainty: float, now: float) -> None:
        held = self._uncertainty + DRIFT * (now - self._measured_at)
        disagree = (self._offset is not None
                    and abs(offset - self._offset) > uncertainty + held)
        if uncertainty <= held or disagree:
            self._offset, self._uncertainty, self._measured_at = offset, uncertainty, now
