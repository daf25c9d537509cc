"""The transition table: exactly the moves drawn in docs/states.md, and no way out of the end."""

from __future__ import annotations

import itertools

import pytest

from jobs.core.states import NEW_ATTEMPT, TERMINAL, TRANSITIONS, Status, is_legal

pytestmark = pytest.mark.unit

W, Q, D, R = Status.WAITING, Status.QUEUED, Status.DISPATCHED, Status.RUNNING
S, F, C, E = Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.EXPIRED

# Written out independently of jobs.core.states, so a change to the table has to change this too.
EXPECTED = {
    (W, Q), (W, C), (W, E),
    (Q, D), (Q, R), (Q, C), (Q, E),
    (D, Q), (D, R), (D, C), (D, E), (D, F),
    (R, S), (R, F), (R, C), (R, Q),
}  # fmt: skip

ALL_PAIRS = list(itertools.product(Status, repeat=2))


@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS, ids=[f"{s}->{d}" for s, d in ALL_PAIRS])
def test_is_legal_for_every_pair(src: Status, dst: Status) -> None:
    assert is_legal(src, dst) is ((src, dst) in EXPECTED)


def test_table_is_exactly_the_expected_one() -> None:
    assert set(TRANSITIONS) == EXPECTED


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_terminal_states_have_no_way_out(state: Status) -> None:
    assert state.terminal
    assert not [dst for dst in Status if is_legal(state, dst)]


def test_terminal_set() -> None:
    assert TERMINAL == {S, F, C, E}
    assert [s for s in Status if not s.terminal] == [W, Q, D, R]


@pytest.mark.parametrize("state", [W, Q, D, R])
def test_every_live_state_can_be_cancelled_and_can_end(state: Status) -> None:
    assert is_legal(state, C)
    assert any(dst.terminal for dst in Status if is_legal(state, dst))


def test_no_state_moves_to_itself() -> None:
    assert all(src != dst for src, dst in TRANSITIONS)


def test_new_attempt_moves_are_the_returns_to_the_queue() -> None:
    assert NEW_ATTEMPT <= TRANSITIONS
    # The feeder's admission of a batch item is the first attempt, not a new one.
    assert {(src, dst) for src, dst in TRANSITIONS if dst is Q and src is not W} == NEW_ATTEMPT


def test_every_state_is_reachable_from_waiting() -> None:
    seen, frontier = {W}, [W]
    while frontier:
        src = frontier.pop()
        for dst in Status:
            if is_legal(src, dst) and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    assert seen == set(Status)
