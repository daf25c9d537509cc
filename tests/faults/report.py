"""Violations of the fault tests' invariants, and the report a failed check prints.

A check collects every violation before it fails, so one run shows all that went wrong: per
invariant, what broke; then each offending job's SQL row and its ``tracked`` trace lines,
with times on one clock (UTC, to the millisecond, as in the processes' logs).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from jobs.core.domain import Job
from tests.faults.handlers import Run

# Examples shown per invariant, and jobs whose row and trace are shown.
MAX_EXAMPLES = 12
MAX_JOBS = 25


@dataclass(frozen=True, kw_only=True)
class Violation:
    invariant: str  # a short name, the same for every violation of one invariant
    detail: str
    job_ids: tuple[str, ...] = ()


def clock_text(epoch: float | None) -> str:
    """``HH:MM:SS.mmm`` UTC: short, and comparable with the processes' log lines."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


def job_row(job: Job, tenant: str) -> str:
    """A job's SQL row on two lines (the payload, minus bulk)."""
    starts = getattr(job, "starts", None)
    counted = "" if starts is None else f" starts={starts}"
    payload = {k: v for k, v in job.payload.items() if k != "n"}
    return (
        f"job {job.id} tenant={tenant} tier={job.tier} kind={job.kind} status={job.status.value}"
        f" attempt={job.attempt}/{job.max_attempts}{counted}"
        f" cancel_requested={job.cancel_requested} payload={payload}\n"
        f"    enqueued {clock_text(job.enqueued_at)} dispatched {clock_text(job.dispatched_at)}"
        f" started {clock_text(job.started_at)} finished {clock_text(job.finished_at)}"
        f" start_by {clock_text(job.start_by)} error={job.error!r}"
    )


def run_line(run: Run) -> str:
    """A trace line: true time, what, attempt, process (and its clock's skew, if any)."""
    skew = f" (its clock {run.skew_s:+.0f} s)" if abs(run.skew_s) >= 1 else ""
    return f"{clock_text(run.at)} {run.what} attempt {run.attempt} pid {run.pid}{skew}"


def render(
    violations: Sequence[Violation],
    *,
    jobs: Mapping[str, Job],
    tenants: Mapping[str, str],
    runs: Mapping[str, Sequence[Run]],
    context: str = "",
) -> str:
    """The failure report: context, violations by invariant, then the offending jobs."""
    by_invariant: dict[str, list[Violation]] = defaultdict(list)
    for violation in violations:
        by_invariant[violation.invariant].append(violation)
    lines = [
        f"{len(violations)} invariant violation(s): "
        + ", ".join(f"{name} ×{len(found)}" for name, found in by_invariant.items())
    ]
    if context:
        lines += ["", context.rstrip()]
    for name, found in by_invariant.items():
        lines += ["", f"== {name} ({len(found)})"]
        lines += [f"  {v.detail}" for v in found[:MAX_EXAMPLES]]
        if len(found) > MAX_EXAMPLES:
            lines.append(f"  ... and {len(found) - MAX_EXAMPLES} more")
    offending = _offending(violations)
    if offending:
        lines += ["", f"== offending jobs: SQL row, then trace ({len(offending)})"]
    for job_id in offending[:MAX_JOBS]:
        job = jobs.get(job_id)
        if job is None:
            lines.append(f"job {job_id}: no row")
        else:
            lines.append(job_row(job, tenants.get(job.tenant_id, job.tenant_id)))
        lines += [f"    {run_line(run)}" for run in runs.get(job_id, [])] or ["    (no trace)"]
    if len(offending) > MAX_JOBS:
        lines.append(f"... and {len(offending) - MAX_JOBS} more jobs")
    return "\n".join(lines)


def _offending(violations: Iterable[Violation]) -> list[str]:
    seen: dict[str, None] = {}
    for violation in violations:
        for job_id in violation.job_ids:
            seen.setdefault(job_id)
    return list(seen)
