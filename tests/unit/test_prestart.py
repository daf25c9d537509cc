"""The registry of starts made ahead: one handling owns a token, a copy never does."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core.domain import Job
from jobs.core.states import Status
from jobs.execution.prestart import Claim, Landing, PreStarts
from jobs.index.base import Finished

pytestmark = pytest.mark.unit


def job() -> Job:
    return Job(id="j", tenant_id="t", tier="free", kind="echo", payload={},
               status=Status.RUNNING, attempt=1, max_attempts=3, order_key=0.0,
               enqueued_at=0.0, created_at=0.0)


def test_a_token_nobody_expected_is_unknown() -> None:
    assert PreStarts().take("t1", wait_s=0)[0] is Claim.UNKNOWN


def test_the_first_taker_gets_the_start_and_a_copy_finds_it_taken() -> None:
    starts, row = PreStarts(), job()
    starts.expect("t1")
    starts.settle("t1", row)

    claim, found, age, _release, landed = starts.take("t1", wait_s=0)

    assert (claim, found, landed) == (Claim.STARTED, row, None) and age >= 0
    assert starts.take("t1", wait_s=0)[0] is Claim.UNKNOWN  # its copy: no start to adopt


def test_a_start_not_made_leaves_the_taker_owning_its_token_and_a_copy_owning_nothing() -> None:
    starts = PreStarts()
    starts.expect("t1")
    starts.settle("t1", None)

    assert starts.take("t1", wait_s=0)[:2] == (Claim.OWN, None)
    assert starts.take("t1", wait_s=0)[0] is Claim.UNKNOWN


def test_a_copy_taken_while_the_first_taker_waits_is_a_copy() -> None:
    starts, row = PreStarts(), job()
    starts.expect("t1")
    first: list[Claim] = []
    waiting = threading.Thread(target=lambda: first.append(starts.take("t1", wait_s=5)[0]))
    waiting.start()
    while not starts.taken("t1"):
        time.sleep(0.001)
    assert starts.take("t1", wait_s=0)[0] is Claim.COPY
    starts.settle("t1", row)
    waiting.join()
    assert first == [Claim.STARTED]


def test_tokens_taken_leave_the_registry_however_their_start_went() -> None:
    """Else every start not made ahead would stay for ``KEEP_S``, and each ``expect`` would
    walk them all."""
    starts, row = PreStarts(), job()
    for n in range(500):
        starts.expect(f"t{n}")
        starts.settle(f"t{n}", row if n % 2 else None)
        starts.take(f"t{n}", wait_s=0)
    assert starts.waiting() == 0


def test_a_late_start_is_waited_for_and_one_too_late_is_the_takers_to_make() -> None:
    starts, row = PreStarts(), job()
    starts.expect("late")
    timer = threading.Timer(0.05, starts.settle, ("late", row))
    timer.start()
    assert starts.take("late", wait_s=5)[:2] == (Claim.STARTED, row)
    timer.join()

    starts.expect("never")
    assert starts.take("never", wait_s=0.01)[:2] == (Claim.OWN, None)


def test_a_token_no_message_carries_is_forgotten() -> None:
    starts = PreStarts()
    starts.expect("unsent")  # the hand-over leased nothing, or its message was not sent
    starts.forget("unsent")
    assert starts.take("unsent", wait_s=0.0)[0] is Claim.UNKNOWN


def test_a_start_settled_before_its_commit_carries_its_landing_and_no_later_settle_replaces_it(
) -> None:
    """Settled early, the taker runs at once and is given the event its ending waits for;
    a settle after that (the handing COMMIT failed: nothing started, it says) comes too
    late to change what the taker was given, and says so."""
    starts, row, landed = PreStarts(), job(), Landing()
    starts.expect("t1")
    assert starts.settle("t1", row, landed=landed)
    assert not starts.settle("t1", None)

    taken = starts.take("t1", wait_s=0)

    assert (taken.claim, taken.job, taken.landed, taken.release) == (
        Claim.STARTED, row, landed, None)


def test_a_settle_after_its_taker_stopped_waiting_says_it_reached_no_one() -> None:
    """The handing task lets the next job run early only when its task was told so: one
    that stopped waiting makes the start itself, and the handing task must not make that
    start's first renewal as well."""
    starts = PreStarts()
    starts.expect("t1")
    assert starts.take("t1", wait_s=0).claim is Claim.OWN

    assert not starts.settle("t1", job(), landed=Landing())


# -- Landing: who makes the first renewal of a job let run before its handing COMMIT -------

ENDED = Finished(job_id="a", attempt=1, outcome="succeeded")


def test_a_commit_that_lands_first_leaves_the_renewal_to_the_handing_task() -> None:
    landing = Landing()
    assert landing.land(ENDED)
    assert landing.committed.is_set() and not landing.renewed.is_set()
    assert not landing.claim()  # too late: the job's ending waits for the renewal
    landing.renewal_made()
    landing.close()
    assert landing.renewed.is_set()


def test_an_ending_that_claims_first_makes_the_renewal_with_the_commits_release() -> None:
    landing = Landing()
    assert landing.claim()
    assert not landing.committed.is_set()
    assert not landing.land(ENDED)  # the handing task leaves it
    landing.close()
    assert landing.committed.is_set() and landing.landed_ok and landing.release == ENDED
    assert not landing.renewed.is_set()  # owed by the job's own ending until it is made
    assert not landing.unclaim()  # landed: it stays the ending's
    landing.renewal_made()
    assert landing.renewed.is_set()


def test_a_claim_given_back_before_the_commit_lands_returns_the_renewal() -> None:
    landing = Landing()
    assert landing.claim()
    assert landing.unclaim()
    assert landing.land(None)  # the handing task's again
    assert not landing.renewed.is_set()
    landing.renewal_made()
    landing.close()
    assert landing.committed.is_set() and landing.renewed.is_set()


def test_a_commit_that_failed_owes_no_renewal_to_anyone() -> None:
    landing = Landing()
    assert landing.claim()
    landing.close()  # no land: the COMMIT failed, the start is a lost one
    assert landing.committed.is_set() and landing.renewed.is_set()
    assert not landing.landed_ok


@given(claim_first=st.booleans(), ends_first=st.booleans(), threads=st.booleans())
def test_exactly_one_side_makes_the_renewal_whatever_the_order(
    claim_first: bool, ends_first: bool, threads: bool
) -> None:
    """The handing task and the job's ending race (on threads, or in either order): one and
    only one of them is told the renewal is its to make, and ``renewed`` is set once it is
    made, never before."""
    landing, told = Landing(), {}

    def handing() -> None:
        told["handing"] = landing.land(ENDED)
        if told["handing"]:
            landing.renewal_made()
        landing.close()

    def ending() -> None:
        told["ending"] = landing.claim()
        if told["ending"]:
            assert landing.committed.wait(5)
            assert not landing.renewed.is_set()
            landing.renewal_made()
        else:
            assert landing.renewed.wait(5)

    order = [ending, handing] if claim_first else [handing, ending]
    if threads:
        running = [threading.Thread(target=step) for step in order]
        for thread in (running if ends_first else running[::-1]):
            thread.start()
        for thread in running:
            thread.join(10)
    else:
        if not claim_first:
            order[0]()
            order[1]()
        else:  # the ending waits for the COMMIT: the handing task runs beside it
            thread = threading.Thread(target=order[0])
            thread.start()
            order[1]()
            thread.join(10)
    assert sorted(told.values()) == [False, True]
    assert landing.renewed.is_set()
