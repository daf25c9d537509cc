"""Starts made ahead by the slot that hands a job over, for the message that follows it.

A slot that frees leases its next job and hands that job's message to this worker's own
consumer (``jobs.index.hand_over``, ``workers.handover``); while the consumer takes the
message, the handing slot makes the job's start in SQL, under the token the message carries,
in the statement that records its own ending. The message's task runs on the pool's spare
thread (``workers.pool``) and waits here for that start: the start overlaps the message's way
instead of following it. On PostgreSQL the start is settled as soon as the statement has
run, before its COMMIT, with a ``Landing``: both rows are the handing transaction's until
then, so no other start can take the job, and its handler runs while the COMMIT waits for
the disk. The handler's ending waits for that COMMIT, since a statement of its own made
earlier would not yet see the row started, and for the job's first renewal (the start's
announcement, which releases the handing lease), made by the handing task after its COMMIT,
or by the ending itself, in its hand-over's round trip, when it got there first.

Process-local, keyed by token (one per message). The first handling to ``take`` a token owns
it: it gets the start made for it, or is told to make the start itself (the start ahead
failed or is late), and may then recognise a start under its token as its own. A token
leaves the registry once taken, however its start went, so the registry holds only messages
on their way and the sweep of those never taken (``KEEP_S``) stays cheap. A copy of the
message (a duplicated delivery) finds the token taken or gone and goes the ordinary way,
where the compare-and-set on the attempt makes it stale: one handler runs, never two.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from jobs.core.domain import Job
from jobs.index.base import Finished

# How long a registration is kept for a message that never came (lost, or its worker gone).
KEEP_S = 120.0


class Claim(Enum):
    """What ``take`` found for a token."""

    STARTED = "started"  # the start was made ahead: run the job
    OWN = "own"  # this handling owns the token, no start was made ahead: start it
    COPY = "copy"  # another handling is taking the token: a copy of the message
    UNKNOWN = "unknown"  # nothing is expected for it in this process (any more)


@dataclass
class _Entry:
    made_at: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    job: Job | None = None
    taken: bool = False
    release: Finished | None = None
    landed: Landing | None = None


class Landing:
    """A start settled before its handing statement's COMMIT: when that COMMIT has landed
    (``committed``; ``landed_ok`` unless it failed), and who makes the job's first renewal
    (the start's announcement, its figures, and the release of the handing attempt,
    ``release``), whose making ``renewed`` tells.

    The handing task makes it as soon as its COMMIT has landed (``land``), unless the job's
    own task, its handler done, said first that it would (``claim``): it then makes it in the
    round trip of its own hand-over (``hand_over``'s ``first``), so a short job's ending does
    not wait for a round trip of the handing task's. Exactly one of them makes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimed = False  # by the job's own task
        self._decided = False  # the handing task's COMMIT has landed, or failed
        self.landed_ok = False
        self.release: Finished | None = None
        self.committed = threading.Event()
        self.renewed = threading.Event()

    def claim(self) -> bool:
        """For the job's own task, its handler done: True when the first renewal is its to
        make, once ``committed`` is set (nothing to make unless ``landed_ok``), telling
        ``renewal_made`` after."""
        with self._lock:
            if not self._decided:
                self._claimed = True
            return self._claimed

    def unclaim(self) -> bool:
        """The job's own task gives its claim back (the COMMIT is late): True when the
        handing task will make the renewal after all, False when it is still the caller's."""
        with self._lock:
            if not self._decided:
                self._claimed = False
            return not self._claimed

    def land(self, release: Finished | None) -> bool:
        """For the handing task, its COMMIT landed: True when the first renewal is its to
        make now (then ``renewal_made``); ``release``: its own attempt, ended (None: its
        ending was stale), for the job's task to release when that one makes it."""
        with self._lock:
            self.release, self.landed_ok, self._decided = release, True, True
            mine = not self._claimed
        self.committed.set()
        return mine

    def renewal_made(self) -> None:
        self.renewed.set()

    def lost(self) -> bool:
        """The COMMIT is known not to have landed (it failed, or its answer never came)."""
        return self.committed.is_set() and not self.landed_ok

    def close(self) -> None:
        """The handing task's last step, however its COMMIT went: ``committed`` set, and
        ``renewed`` too unless the job's own task is to make the renewal."""
        with self._lock:
            self._decided = True
            owed = self.landed_ok and self._claimed
        self.committed.set()
        if not owed:
            self.renewed.set()


class Taken(NamedTuple):
    """What ``take`` found: the claim, the row started ahead (``STARTED`` only), its age in
    seconds, and the handing attempt whose lease the taker releases with its first
    renewal (``STARTED`` only; None: the handing task released it). ``landed``: settled
    before the handing statement's COMMIT (``Landing``); the taker's ending waits for that
    COMMIT, and for the first renewal unless it makes that itself."""

    claim: Claim
    job: Job | None
    age: float
    release: Finished | None = None
    landed: Landing | None = None


class PreStarts:
    """The starts made ahead in this process, by token."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def expect(self, token: str) -> None:
        """A start will be made ahead for ``token`` (before its message can be taken)."""
        now = time.monotonic()
        with self._lock:
            if len(self._entries) > 64:
                self._entries = {t: e for t, e in self._entries.items()
                                 if now - e.made_at < KEEP_S}
            self._entries[token] = _Entry(made_at=now)

    def waiting(self) -> int:
        """How many tokens are held: messages on their way, or taken and being waited for."""
        with self._lock:
            return len(self._entries)

    def taken(self, token: str) -> bool:
        """Whether a handling is taking ``token`` now (waiting for its start)."""
        with self._lock:
            entry = self._entries.get(token)
            return entry is not None and entry.taken

    def forget(self, token: str) -> None:
        """No message carries ``token`` after all (nothing was handed over)."""
        with self._lock:
            self._entries.pop(token, None)

    def settle(self, token: str, job: Job | None, *, release: Finished | None = None,
               landed: Landing | None = None) -> bool:
        """The start made ahead for ``token``: the row, or None (not made); ``release``: the
        handing attempt, ended and committed, whose lease the taker is to release;
        ``landed``: see ``Taken``. False when no handling waits for it any more (it stopped
        waiting, or was settled already): what it is told then, it will not learn."""
        with self._lock:
            entry = self._entries.get(token)
            if entry is None or entry.done.is_set():
                return False
            entry.job = job
            entry.release = release
            entry.landed = landed
            entry.done.set()
            return True

    def take(self, token: str, *, wait_s: float) -> Taken:
        """Claim ``token`` for this handling, waiting up to ``wait_s`` for a start being made;
        returns the claim, the row started ahead (``STARTED`` only) and its age in seconds."""
        with self._lock:
            entry = self._entries.get(token)
            if entry is None:
                return Taken(Claim.UNKNOWN, None, 0.0)
            if entry.taken:
                return Taken(Claim.COPY, None, 0.0)
            entry.taken = True
        entry.done.wait(wait_s)
        age = time.monotonic() - entry.made_at
        with self._lock:  # taken once: a later take is no owner's (UNKNOWN, as a copy's)
            self._entries.pop(token, None)
        if entry.done.is_set() and entry.job is not None:
            return Taken(Claim.STARTED, entry.job, age, entry.release, entry.landed)
        return Taken(Claim.OWN, None, age)


PRE_STARTS = PreStarts()
