"""The invariant checker's own logic, on hand-made rows and traces (no servers).

A checker that cries wolf, or stays silent, makes every fault test worthless: these pin
down how runs are paired into spans, when a tenant counts as over its cap, which ``done``
lines count as completions, and how ``starts`` is checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobs.core.domain import Job
from jobs.core.states import Status
from tests.faults import checks
from tests.faults.checks import Span, overshoots, run_spans
from tests.faults.handlers import Run

pytestmark = pytest.mark.unit

DEAD_PID = 2**22 + 1  # above the default pid_max: no such process


def job(job_id: str = "j1", **fields: Any) -> Job:
    values: dict[str, Any] = {
        "id": job_id, "tenant_id": "t1", "tier": "free", "kind": "tracked", "payload": {},
        "status": Status.SUCCEEDED, "attempt": 1, "max_attempts": 3, "order_key": 0.0,
        "created_at": 0.0, "enqueued_at": 0.0, "started_at": 1.0, "finished_at": 2.0,
        "starts": 1,
    }
    return Job(**{**values, **fields})


def run(what: str, at: float, *, attempt: int = 1, pid: int = DEAD_PID,
        job_id: str = "j1") -> Run:
    return Run(what=what, job_id=job_id, attempt=attempt, pid=pid, at=at, seen=at)


def span(start: float, end: float, job_id: str = "j") -> Span:
    return Span(job_id=job_id, tenant_id="t1", attempt=1, pid=1, start=start, end=end,
                how="done")


def test_a_run_ending_as_the_next_starts_does_not_overlap_it() -> None:
    assert overshoots([span(0, 1), span(1, 2)], cap=1) == []


def test_an_overshoot_reports_its_peak_once_per_episode() -> None:
    episodes = overshoots([span(0, 10, "a"), span(1, 5, "b"), span(2, 4, "c"),
                           span(6, 7, "d"), span(6, 8, "e")], cap=2)
    assert [(e.began, e.peak_at, e.ended, [s.job_id for s in e.spans]) for e in episodes] == [
        (2, 2, 4, ["a", "b", "c"]), (6, 6, 7, ["a", "d", "e"])]


def test_an_overlap_within_the_clocks_disagreement_is_forgiven_only_with_a_run_from_sql() -> None:
    # A traced run ends 7 ms after SQL says the next one (known only from SQL) started: its
    # worker's estimate of Redis's clock was that far behind. Longer, or between two traced
    # runs, it is an overshoot.
    traced, next_traced = span(0, 1.007, "a"), span(1.0, 2, "b")
    from_sql = dataclasses.replace(next_traced, pid=None, how="SQL")
    slack = checks.SQL_CLOCK_SLACK_S
    caps, names = {("t1", "default"): 1}, {}
    assert checks.check_caps([traced, from_sql], caps, names) == []
    assert len(checks.check_caps([traced, next_traced], caps, names)) == 1
    late = dataclasses.replace(traced, end=1.0 + slack * 2)
    assert len(checks.check_caps([late, from_sql], caps, names)) == 1


def test_a_run_without_an_end_line_ends_when_its_process_was_killed() -> None:
    runs = {"j1": [run("start", 1.0), run("start", 9.0, attempt=2), run("done", 9.5,
                                                                          attempt=2)]}
    traced = run_spans({"j1": job(attempt=2)}, runs, {DEAD_PID: 3.0}, traced=True)
    assert sorted((s.attempt, s.start, s.end, s.how) for s in traced) == [
        (1, 1.0, 3.0, "killed"), (2, 9.0, 9.5, "done")]


def test_a_run_of_an_unknown_death_ends_by_the_next_start_of_its_job() -> None:
    runs = {"j1": [run("start", 1.0), run("start", 9.0, attempt=2), run("done", 9.5,
                                                                          attempt=2)]}
    traced = run_spans({"j1": job(attempt=2)}, runs, {}, traced=True)
    assert (traced[-1].attempt, traced[-1].end, traced[-1].how) == (1, 9.0, "next start")


def test_a_done_lost_with_its_killed_worker_is_not_a_second_completion() -> None:
    runs = {"j1": [run("start", 1.0), run("done", 2.0), run("start", 5.0, attempt=2, pid=7),
                   run("done", 6.0, attempt=2, pid=7)]}
    assert checks.check_runs({"j1": job(attempt=2)}, runs, {DEAD_PID: 2.01}) == []
    assert [v.invariant for v in checks.check_runs({"j1": job(attempt=2)}, runs, {})] == [
        "completed exactly once"]


def test_a_failed_job_with_a_done_threw_a_result_away() -> None:
    failed = job(status=Status.FAILED, error="lease expired on attempt 3 of 3", attempt=3,
                 max_attempts=3)
    found = checks.check_runs({"j1": failed}, {"j1": [run("done", 2.0, attempt=3)]}, {})
    assert [v.invariant for v in found] == ["no result thrown away"]


def test_starts_are_checked() -> None:
    spent = dataclasses.replace(
        job(status=Status.FAILED, error="lease expired (start 3 of 3)", attempt=3), starts=1)
    runs = {"j1": [run("start", 1.0, attempt=a) for a in (1, 2)]}
    found = checks.check_starts({"j1": spent}, runs)
    assert sorted(v.detail.split(": ", 1)[1] for v in found) == [
        "2 attempts started in the trace, starts=1",
        "failed (lease expired (start 3 of 3)) after 1 of 3 starts",
    ]


def test_a_failure_for_a_late_retry_is_not_a_spent_one() -> None:
    late = dataclasses.replace(
        job(status=Status.FAILED, error="boom (start 1; a retry could not start before the "
            "job's deadline, max_wait_s)"), starts=1)
    assert checks.check_starts({"j1": late}, {"j1": [run("start", 1.0)]}) == []


def test_a_tenants_cap_holds_in_each_pool_on_its_own() -> None:
    gpu_job = job("g1", kind="tracked.gpu", started_at=1.0, finished_at=3.0)
    cpu_job = job("c1", started_at=1.5, finished_at=2.5)
    spans = run_spans({"g1": gpu_job, "c1": cpu_job}, {}, {}, traced=False,
                      kind_pools={"tracked.gpu": "gpu"})
    assert sorted((s.job_id, s.pool) for s in spans) == [("c1", "default"), ("g1", "gpu")]
    caps = {("t1", "default"): 1, ("t1", "gpu"): 1}
    names = {key: f"t1 in {key[1]}" for key in caps}
    assert checks.check_caps(spans, caps, names) == []  # one at a time in each pool
    second = dataclasses.replace(spans[0], job_id="x", start=1.6, end=2.0)
    found = checks.check_caps([*spans, second], caps, names)
    assert len(found) == 1 and f"t1 in {second.pool} went over its cap" in found[0].detail


def test_a_tenants_items_of_one_packed_run_hold_one_slot() -> None:
    # Three items of one run (one process, one start instant) and a run of another
    # process after it: cap 1 holds. The same items started apart would overshoot it.
    caps, names = {("t1", "default"): 1}, {}
    packed = [span(0, 1, "a"), span(0, 1.001, "b"), span(0, 1.002, "c"), span(1.01, 2, "d")]
    assert checks.check_caps(packed, caps, names) == []
    apart = [span(0, 1, "a"), dataclasses.replace(span(0.5, 1, "b"), pid=2)]
    assert len(checks.check_caps(apart, caps, names)) == 1
