"""The process's one renewing thread: every heartbeat is renewed when it is due, whichever
order they were added in (the renewer is woken only for one due sooner than it waits for)."""

from __future__ import annotations

import threading
import weakref

import pytest

from jobs.execution.renewer import Renewer

pytestmark = pytest.mark.unit


class Beat:
    """A heartbeat that records its ticks; ``due_in`` its period."""

    def __init__(self, period_s: float) -> None:
        self.renew_every_s = period_s
        self.ticked = threading.Event()

    def due_in(self) -> float:
        return self.renew_every_s

    def tick(self) -> None:
        self.ticked.set()


@pytest.fixture
def renewer() -> Renewer:
    return Renewer()


@pytest.mark.parametrize(("period_s", "now"), [(0.05, False), (60.0, True)],
                         ids=["due sooner", "at once"])
def test_one_due_sooner_than_the_renewer_waits_for_is_renewed_in_time(
    renewer: Renewer, period_s: float, now: bool,
) -> None:
    """Due before the one the renewer waits for, or to be renewed at once (a start's
    announcement): the renewer is woken for it."""
    later = Beat(60.0)
    renewer.add(later, now=False)
    sooner = Beat(period_s)
    renewer.add(sooner, now=now)

    assert sooner.ticked.wait(10)
    assert not later.ticked.is_set()
    renewer.remove(sooner)
    renewer.remove(later)


def test_one_due_later_is_renewed_after_the_one_before_it(renewer: Renewer) -> None:
    before, after = Beat(0.05), Beat(0.1)
    renewer.add(before, now=False)
    renewer.add(after, now=False)  # no wake-up: the renewer wakes for the first anyway

    assert before.ticked.wait(10) and after.ticked.wait(10)
    renewer.remove(before)
    renewer.remove(after)


def test_a_removed_heartbeat_is_not_renewed_again(renewer: Renewer) -> None:
    beat = Beat(0.02)
    renewer.add(beat, now=False)
    assert beat.ticked.wait(10)
    renewer.remove(beat)
    beat.ticked.clear()
    after = Beat(0.2)  # due well past the removed one's next turn
    renewer.add(after, now=False)
    assert after.ticked.wait(10)
    assert not beat.ticked.is_set()
    renewer.remove(after)


def test_a_removed_heartbeat_is_let_go_at_once(renewer: Renewer) -> None:
    """Removed long before it would come due, it is no longer held by the schedule: an
    ended job's heartbeat is freed at its end (by its last reference, not the collector)."""
    due_later = Beat(60.0)
    renewer.add(due_later, now=False)
    ended = Beat(60.0)
    renewer.add(ended, now=False)
    gone = weakref.ref(ended)
    renewer.remove(ended)
    del ended
    assert gone() is None
    renewer.remove(due_later)
