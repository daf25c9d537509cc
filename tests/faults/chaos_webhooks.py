"""The chaos soak's webhooks that try to harm the dispatcher, and what must hold of them.

Receivers on the address the soak's operator allows (``ALLOWED``, 127.0.0.2: all of
127.0.0.0/8 is loopback): one that takes the request and never answers, one whose ``200``
never ends, one whose ``500`` is 48 MiB. Names from the soak's DNS
(``tests/faults/soak_site``): one whose lookup never answers, and one that answers the
allowed address to the API's check and loopback to the deliverer, where ``inside`` (on
127.0.0.1, refused) listens. What must hold: nothing ever reaches ``inside``; every event of
these jobs has its tries recorded (none is claimed again and again without a trace), the
rebinding one given up as pointing inside; and, with the rest of the soak, the dispatchers
live on and the good receiver's events are still delivered.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import BinaryIO

import sqlalchemy as sa

from jobs.store.models import WebhookAttemptRow, WebhookEventRow
from tests.faults.report import Violation
from tests.faults.soak_names import ALLOWED, REBIND, SLOW_DNS
from tests.webhook_receiver import Answers, Receiver

EVENTS = WebhookEventRow.__table__
ATTEMPTS = WebhookAttemptRow.__table__
# How long the check waits for every try to be recorded: a hanging receiver's try takes
# the deliverer's 10 s, and a lapsed claim 30 s.
RECORDED_WITHIN_S = 60.0


@dataclass
class BadReceivers:
    ended: threading.Event = field(default_factory=threading.Event)
    hanging: Receiver = field(init=False)
    endless: Receiver = field(init=False)
    huge: Receiver = field(init=False)
    inside: Receiver = field(init=False)

    def __post_init__(self) -> None:
        answers = Answers(self.ended)
        self.hanging = Receiver(0, lambda got, tries: 204, reply=self._hang, host=ALLOWED)
        self.endless = Receiver(0, lambda got, tries: 204, reply=answers.endless, host=ALLOWED)
        self.huge = Receiver(0, lambda got, tries: 204, reply=answers.huge_error, host=ALLOWED)
        self.inside = Receiver(0, lambda got, tries: 204)  # 127.0.0.1: must stay untouched

    def _hang(self, out: BinaryIO) -> None:
        """Takes the request and answers nothing until the soak ends."""
        self.ended.wait(120)

    def urls(self, n: int) -> dict[str, str]:
        """Each harmful receiver's URL by what it does (``n`` makes the names unique)."""
        return {
            "hanging": self.hanging.url,
            "endless": self.endless.url,
            "huge": self.huge.url,
            "slow-dns": f"http://hook-{n}{SLOW_DNS}:{self.hanging.port}/hook",
            "rebinding": f"http://hook-{n}{REBIND}:{self.inside.port}/hook",
        }

    def close(self) -> None:
        self.ended.set()
        for receiver in (self.hanging, self.endless, self.huge, self.inside):
            receiver.close()


def bad_webhooks_held(database_url: str, jobs: dict[str, str],
                      receivers: BadReceivers) -> list[Violation]:
    """``jobs``: job id → what its webhook does. Waits (bounded) for each event of an ended
    job to have a try recorded, then checks what must hold."""
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    deadline = time.monotonic() + RECORDED_WITHIN_S
    try:
        while True:
            with engine.connect() as conn:
                events = conn.execute(sa.select(EVENTS.c.id, EVENTS.c.job_id, EVENTS.c.status)
                                      .where(EVENTS.c.job_id.in_(list(jobs)))).all()
                tried = {row.event_id: row.error for row in conn.execute(
                    sa.select(ATTEMPTS.c.event_id, ATTEMPTS.c.error)
                    .where(ATTEMPTS.c.event_id.in_([e.id for e in events])))}
            untried = [e for e in events if e.id not in tried]
            if not untried or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    finally:
        engine.dispose()
    found = [Violation(invariant="every webhook try is recorded",
                       detail=f"{e.job_id} ({jobs[e.job_id]}): event {e.id} {e.status}, no try "
                              f"recorded within {RECORDED_WITHIN_S:g} s", job_ids=(e.job_id,))
             for e in untried]
    for event in events:
        if jobs[event.job_id] == "rebinding" and event.id in tried and (
                event.status != "failed" or "loopback" not in (tried[event.id] or "")):
            found.append(Violation(
                invariant="a name that turns inside is given up, not called",
                detail=f"{event.job_id}: event {event.status}, try {tried[event.id]!r}",
                job_ids=(event.job_id,)))
    if receivers.inside.received:
        found.append(Violation(invariant="no webhook reaches an address inside a network",
                               detail=f"{len(receivers.inside.received)} requests reached "
                                      f"127.0.0.1:{receivers.inside.port}"))
    return found
