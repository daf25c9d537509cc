"""``check_run``: what a packing handler learns between batches. A stop of the whole run
(lease lost, worker stopping, timed out) is marked on every context and raises; a cancel is
its item's alone and only drops that item from the ones still wanted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.handlers import (
    JobCancelled,
    JobContext,
    JobInterrupted,
    JobTimedOut,
    LeaseLost,
    WorkerStopping,
    check_run,
)

pytestmark = pytest.mark.unit


def contexts(n: int) -> list[JobContext]:
    return [JobContext(job_id=f"job-{i}", attempt=1, tenant_id="t", kind="k") for i in range(n)]


def test_a_run_with_nothing_marked_wants_every_item() -> None:
    assert check_run(contexts(3)) == [0, 1, 2]
    assert check_run([]) == []


def test_a_cancel_drops_its_item_and_raises_nothing() -> None:
    run = contexts(4)
    run[1].mark_cancelled()
    run[3].mark_cancelled()
    assert check_run(run) == [0, 2]
    for ctx in run:
        ctx.mark_cancelled()
    assert check_run(run) == []  # the handler returns each its JobCancelled


@pytest.mark.parametrize(("mark", "raised"), [
    (JobContext.mark_lease_lost, LeaseLost),
    (JobContext.mark_handed_back, WorkerStopping),
    (JobContext.mark_timed_out, JobTimedOut),
])
def test_a_stop_of_the_whole_run_raises_its_interruption(
    mark: object, raised: type[JobInterrupted],
) -> None:
    run = contexts(3)
    run[0].mark_cancelled()  # a cancelled item does not hide the run's stop
    for ctx in run:
        mark(ctx)  # type: ignore[operator]
    with pytest.raises(raised) as caught:
        check_run(run)
    assert not isinstance(caught.value, JobCancelled)


FLAGS = st.fixed_dictionaries({
    "cancel": st.booleans(), "lost": st.booleans(), "handback": st.booleans(),
    "timeout": st.booleans(),
})


@given(st.lists(FLAGS, max_size=6))
def test_check_run_raises_the_gravest_stop_or_names_the_wanted(
    flags: list[dict[str, bool]],
) -> None:
    run = contexts(len(flags))
    for ctx, flag in zip(run, flags, strict=True):
        if flag["cancel"]:
            ctx.mark_cancelled()
        if flag["lost"]:
            ctx.mark_lease_lost()
        if flag["handback"]:
            ctx.mark_handed_back()
        if flag["timeout"]:
            ctx.mark_timed_out()
    first = next((name for name in ("lost", "handback", "timeout")
                  if any(flag[name] for flag in flags)), None)
    if first is None:
        assert check_run(run) == [i for i, flag in enumerate(flags) if not flag["cancel"]]
        return
    expected = {"lost": LeaseLost, "handback": WorkerStopping, "timeout": JobTimedOut}[first]
    with pytest.raises(expected):
        check_run(run)
