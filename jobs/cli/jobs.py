"""``tierq submit``, ``upload``, ``status`` and ``tierq jobs``: a tenant's jobs, over the API
with its key, so they go through admission as any client's would."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from jobs.cli.common import ApiKey, ApiUrl, api_client, fail, friendly
from jobs.cli.webhooks import WebhookEvents, WebhookUrl, webhook_of

if TYPE_CHECKING:
    from jobs.client.http import Client


def _payload(text: str) -> dict[str, Any]:
    """The payload given as JSON, or ``@FILE``: the JSON object in that file."""
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text()
        except OSError as exc:
            fail(f"--payload {text[:200]}: cannot read {path}: {exc.strerror}", 2)
        except UnicodeDecodeError:
            fail(f"--payload: {path} is not UTF-8 text", 2)
    try:
        payload = json.loads(text)
    except ValueError as exc:
        fail(f"--payload is not valid JSON: {exc}", 2)
    if not isinstance(payload, dict):
        fail("--payload must be a JSON object, e.g. '{\"seconds\": 2}'", 2)
    return payload


@friendly
def submit(
    kind: Annotated[str, typer.Argument(help="Job kind, e.g. sleep or echo.")],
    payload: Annotated[str, typer.Option(
        help="The job's payload, a JSON object, or @FILE to read it from a file.")] = "{}",
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the result.")] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="Unique per tenant.")] = None,
    max_wait: Annotated[
        float | None, typer.Option(help="Expire the job if it has not started by then (s).")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="The longest one attempt may run (s); default: the "
                                   "kind's, else policy.default_timeout_s.")
    ] = None,
    max_attempts: Annotated[int | None, typer.Option(
        min=1, max=100, show_default=False,
        help="Starts allowed before the job fails (default: policy.max_attempts).")] = None,
    webhook: WebhookUrl = None,
    webhook_event: WebhookEvents = None,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Submit a job; with --wait, follow it (a progress bar while it runs) and print its
    result. Refusals the client retries are said as they happen."""
    from jobs.client.http import ApiError, Refused

    body = _payload(payload)
    if max_wait is not None and not (math.isfinite(max_wait) and max_wait > 0):
        fail(f"--max-wait must be a positive number of seconds, not {max_wait}", 2)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        fail(f"--timeout must be a positive number of seconds, not {timeout}", 2)
    console = Console(highlight=False, soft_wrap=True)
    with api_client(api_url, key, announce=True) as client:
        try:
            job = client.submit(kind, body, idempotency_key=idempotency_key, max_wait_s=max_wait,
                                timeout_s=timeout, max_attempts=max_attempts,
                                webhook=webhook_of(webhook, webhook_event))
        except Refused as exc:
            retry = f"{exc.retry_after_s:g}" if exc.retry_after_s is not None else "a few"
            fail(f"refused ({exc.type}): {exc.message} Retry after {retry} s.", 2)
        except ApiError as exc:
            fail(f"not submitted: {exc}", 2)
        console.print(f"job {job.get('id')}  tier {job.get('tier')}  {_place(job)}")
        if wait:
            _follow(client, str(job["id"]), console)


def _place(job: dict[str, Any]) -> str:
    """Where a just-submitted job stands, rounded: "position 3 · starts in about 1.2 s"."""
    position, wait = job.get("queue_position"), job.get("estimated_wait_s")
    if position is None:
        return str(job.get("status"))
    if not isinstance(wait, int | float):
        return f"position {position} · no estimate yet"
    return f"position {position} · starts in about {wait:.1f} s"


def _follow(client: Client, job_id: str, console: Console) -> None:
    """Show the job's state and its handler's progress (a bar, from its event stream) until
    it is terminal; print the result and set the exit code."""
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from jobs.client.http import ApiError

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TaskProgressColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("queued", total=None)
            state = {"status": "queued"}

            def update(job: dict[str, Any]) -> None:
                status = state["status"] = str(job.get("status"))
                where = f" · position {job.get('queue_position')}" if status == "queued" else ""
                progress.update(task, description=f"{status}{where}")
                report = job.get("progress")
                if isinstance(report, dict):
                    show(report)

            def show(report: dict[str, Any]) -> None:
                said = f" · {report['message']}" if report.get("message") else ""
                progress.update(task, total=1.0, completed=float(report.get("fraction", 0)),
                                description=f"{state['status']}{said}")

            final = _final_state(client, job_id, update, show)
            outcome = client.result(job_id) if final.get("status") == "succeeded" else final
    except ApiError as exc:
        fail(f"lost track of job {job_id}: {exc}", 1)
    except KeyboardInterrupt:
        fail(f"stopped waiting; the job goes on: tierq status {job_id}", 130)
    if final.get("status") != "succeeded":
        fail(f"job {job_id} {final.get('status')}: {final.get('error')}", 1)
    console.print_json(json.dumps(outcome.get("result")))


def _final_state(
    client: Client, job_id: str, update: Callable[[dict[str, Any]], None],
    show: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """The job once terminal, following its event stream; long-polls where the stream is
    cut (a proxy that buffers it, a connection lost)."""
    from jobs.client.http import TERMINAL_STATUSES, ApiError

    final: dict[str, Any] = {}
    try:
        for event in client.events(job_id):
            if event.event == "job" and isinstance(event.data, dict):
                final = event.data
                update(final)
            elif event.event == "progress" and isinstance(event.data, dict):
                show(event.data)
    except ApiError:
        pass  # followed by long-polls below
    if final.get("status") in TERMINAL_STATUSES:
        return final
    return client.wait(job_id, on_update=update)


@friendly
def upload(
    file: Annotated[Path, typer.Argument(help="The document: PDF, text or markdown.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the result.")] = False,
    kind: Annotated[str, typer.Option(help="The job kind to run on it.")] = "document.embed",
    max_wait: Annotated[
        float | None, typer.Option(help="Expire the job if it has not started by then (s).")
    ] = None,
    webhook: WebhookUrl = None,
    webhook_event: WebhookEvents = None,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Upload a document and submit a job for it; with --wait, follow it and print its
    result."""
    from jobs.client.http import ApiError, Refused

    if not file.is_file():
        fail(f"no such file: {file}", 2)
    if max_wait is not None and not (math.isfinite(max_wait) and max_wait > 0):
        fail(f"--max-wait must be a positive number of seconds, not {max_wait}", 2)
    console = Console(highlight=False, soft_wrap=True)
    with api_client(api_url, key, announce=True) as client:
        try:
            job = client.upload(file, kind=kind, max_wait_s=max_wait,
                                webhook=webhook_of(webhook, webhook_event))
        except Refused as exc:
            retry = f"{exc.retry_after_s:g}" if exc.retry_after_s is not None else "a few"
            fail(f"refused ({exc.type}): {exc.message} Retry after {retry} s.", 2)
        except ApiError as exc:
            fail(f"not uploaded: {exc}", 2)
        document = job.get("document") or {}
        console.print(
            f"job {job.get('id')}  {document.get('content_type')}  {document.get('bytes')} bytes"
            f"  sha256 {document.get('sha256')}  position {job.get('queue_position')}"
        )
        if wait:
            _follow(client, str(job["id"]), console)


@friendly
def status(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Print a job's status as JSON."""
    from jobs.client.http import ApiError

    with api_client(api_url, key) as client:
        try:
            job = client.get(job_id)
        except ApiError as exc:
            fail(str(exc), 1)
    Console().print_json(json.dumps(job))


JobId = Annotated[str, typer.Argument(help="The job's id.")]


@friendly
def jobs_get(
    job_id: JobId,
    wait: Annotated[
        float | None, typer.Option(min=0, max=60, help="Long-poll up to this many seconds.")
    ] = None,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Print a job (as JSON); with --wait, once its status changes or the time is up."""
    with api_client(api_url, key) as client:
        job = client.get(job_id, wait=wait)
    Console(highlight=False, soft_wrap=True).print_json(json.dumps(job))


@friendly
def jobs_list(
    status: Annotated[
        str | None,
        typer.Option(help="Only jobs in this state (waiting, queued, dispatched, running, "
                          "succeeded, failed, cancelled, expired)."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Jobs on this page.")] = 20,
    cursor: Annotated[
        str | None, typer.Option(help="Continue after a page (its next_cursor).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the page as JSON, for scripts.")
    ] = False,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """List this tenant's jobs, newest first, a page at a time."""
    with api_client(api_url, key) as client:
        page = client.list_jobs(status=status, limit=limit, cursor=cursor)
    console = Console(highlight=False, soft_wrap=not as_json)
    if as_json:
        console.print_json(json.dumps(page))
        return
    console.print(jobs_table(page.get("jobs", []), console.width))
    following = page.get("next_cursor")
    if following:
        console.print(f"more: tierq jobs list --cursor {following}", style="dim", markup=False)


def jobs_table(jobs: list[dict[str, Any]], width: int) -> Table:
    """One row a job, in ``width`` columns: the id and status are never cut (ids are copied
    from here); the error is cut first, then the columns that matter least are left out."""
    columns: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = [
        ("id", 36, lambda job: str(job.get("id"))),
        ("status", 10, lambda job: str(job.get("status"))),
        ("kind", 8, lambda job: str(job.get("kind"))),
        ("created (UTC)", 14, lambda job: _short_time(job.get("created_at"))),
        ("waited", 7, _waited),
        ("att", 3, lambda job: str(job.get("attempt", ""))),
        ("error", 8, lambda job: str(job.get("error") or "")),
    ]
    shown: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = []
    used = 0
    for column in columns:
        if used + column[1] + 2 > width and shown:
            continue
        shown.append(column)
        used += column[1] + 2
    table = Table(box=None, pad_edge=False, expand=False, width=width)
    for name, least, _ in shown:
        table.add_column(name, min_width=least, no_wrap=True, overflow="ellipsis",
                         ratio=1 if name == "error" else None,
                         max_width=16 if name == "kind" else None,
                         justify="right" if name in ("waited", "att") else "left")
    for job in jobs:
        table.add_row(*(cell(job) for _, _, cell in shown))
    return table


def _short_time(stamp: Any) -> str:
    """``MM-DD HH:MM:SS`` of an RFC 3339 time."""
    return str(stamp or "")[5:19].replace("T", " ")


def _waited(job: dict[str, Any]) -> str:
    """Queue wait (enqueued → started), where both are known."""
    from datetime import datetime

    try:
        started = datetime.fromisoformat(str(job["started_at"]))
        enqueued = datetime.fromisoformat(str(job["enqueued_at"]))
    except (KeyError, TypeError, ValueError):
        return ""
    return f"{(started - enqueued).total_seconds():.1f} s"


@friendly
def jobs_result(job_id: JobId, api_url: ApiUrl = None, key: ApiKey = None) -> None:
    """Print a finished job's result (as JSON); exit 1 when it failed, was cancelled or
    expired, 3 while it is not finished."""
    with api_client(api_url, key) as client:
        answer = client.result(job_id)
    if "result" not in answer:
        fail(f"job {job_id} is {answer.get('status')}: no result yet", 3)
    Console(highlight=False, soft_wrap=True).print_json(json.dumps(answer["result"]))


@friendly
def jobs_cancel(job_id: JobId, api_url: ApiUrl = None, key: ApiKey = None) -> None:
    """Cancel a job: at once when it has not started, cooperatively when it runs."""
    with api_client(api_url, key, announce=True) as client:
        answer = client.cancel(job_id)
    pending = " (the handler was asked to stop)" if answer.get("cancel_requested") else ""
    Console(highlight=False, soft_wrap=True).print(
        f"job {job_id}  {answer.get('status')}{pending}")


@friendly
def jobs_retry(job_id: JobId, api_url: ApiUrl = None, key: ApiKey = None) -> None:
    """Submit a failed, expired or cancelled job again, as a new job (the old one stays)."""
    from jobs.client.http import ApiError, Refused

    with api_client(api_url, key, announce=True) as client:
        try:
            job = client.retry(job_id)
        except Refused as exc:
            retry = f"{exc.retry_after_s:g}" if exc.retry_after_s is not None else "a few"
            fail(f"refused ({exc.type}): {exc.message} Retry after {retry} s.", 2)
        except ApiError as exc:
            fail(f"not retried: {exc}", 2)
    Console(highlight=False, soft_wrap=True).print(
        f"job {job.get('id')} retries {job_id}  tier {job.get('tier')}  "
        f"position {job.get('queue_position')}")


def jobs_app() -> typer.Typer:
    jobs = typer.Typer(help="Look at, cancel and retry jobs (over the API, with a tenant key).",
                       no_args_is_help=True)
    jobs.command("list")(jobs_list)
    jobs.command("get")(jobs_get)
    jobs.command("result")(jobs_result)
    jobs.command("cancel")(jobs_cancel)
    jobs.command("retry")(jobs_retry)
    return jobs
