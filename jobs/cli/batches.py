"""``tierq batch``: submit a batch from a file (with a progress bar to its end) and print its
results as NDJSON. Over the API with a tenant key, as ``tierq jobs`` is."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from jobs.cli.common import ApiKey, ApiUrl, api_client, fail, friendly
from jobs.cli.webhooks import webhook_of

# How often ``--wait`` asks for the batch's counts.
POLL_S = 1.0
DONE = ("succeeded", "failed", "cancelled", "expired")


def _items(path: Path) -> Iterator[dict[str, Any]]:
    """The file's items: NDJSON (one object a line) or a JSON array of objects."""
    try:
        text = path.read_text()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}", 2)
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            fail(f"{path} is not valid JSON: {exc}", 2)
        yield from _objects(path, enumerate(items, 1))
        return
    lines = ((number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip())
    parsed = []
    for number, line in lines:
        try:
            parsed.append((number, json.loads(line)))
        except ValueError as exc:
            fail(f"{path}:{number} is not valid JSON: {exc}", 2)
    yield from _objects(path, iter(parsed))


def _objects(path: Path, numbered: Iterator[tuple[int, Any]]) -> Iterator[dict[str, Any]]:
    for number, item in numbered:
        if not isinstance(item, dict):
            fail(f"{path}: item {number} is not a JSON object", 2)
        yield item


@friendly
def batch_submit(
    file: Annotated[Path, typer.Argument(help="The items: NDJSON, or a JSON array of objects.")],
    kind: Annotated[str, typer.Option("--kind", help="The kind of every item.")],
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until it ends.")] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="Unique per tenant.")] = None,
    envelope: Annotated[bool, typer.Option(
        "--envelope", help='Each item is {"custom_id": ..., "payload": {...}}; results and '
                           "failures are named by custom_id.")] = False,
    completion_window: Annotated[float | None, typer.Option(
        min=0.001, max=7 * 86400, show_default=False,
        help="Seconds: items not started by then expire.")] = None,
    webhook: Annotated[str | None, typer.Option(
        "--webhook", show_default=False,
        help="POST the batch's events to this URL, signed (tierq webhooks secret).")] = None,
    webhook_event: Annotated[list[str] | None, typer.Option(
        "--webhook-event", show_default=False,
        help="completed (every item ended) or item.completed (each item as it ends); repeat "
             "it; default: completed.")] = None,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Submit a batch; its items enter the live queue as room allows. With --wait, show a
    progress bar until every item has ended, then name the items that did not succeed
    (exit 1 if any failed or expired)."""
    from jobs.client.http import ApiError

    items = list(_items(file))
    console = Console(highlight=False, soft_wrap=True, stderr=True)
    with api_client(api_url, key, announce=True) as client:
        try:
            batch = client.submit_batch(kind, items, idempotency_key=idempotency_key,
                                        envelope=envelope,
                                        completion_window_s=completion_window,
                                        webhook=webhook_of(webhook, webhook_event))
        except ApiError as exc:
            fail(f"not submitted: {exc}", 2)
        Console(highlight=False, soft_wrap=True).print(
            f"batch {batch.get('id')}  tier {batch.get('tier')}  items {batch.get('total')}")
        if wait:
            _follow(client, str(batch["id"]), int(batch.get("total") or 0), console)


def _follow(client: Any, batch_id: str, total: int, console: Console) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from jobs.client.http import ApiError

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("waiting", total=total)

            def show(state: dict[str, Any]) -> dict[str, Any]:
                counts: dict[str, Any] = state.get("counts", {})
                done = sum(int(counts.get(name, 0)) for name in DONE)
                eta = state.get("estimated_finish_s")
                note = f" · about {eta:.0f} s left" if isinstance(eta, (int, float)) else ""
                progress.update(task, completed=done,
                                description=f"{state.get('status')}{note}")
                return counts

            state: dict[str, Any] = {}
            with contextlib.suppress(ApiError):  # a stream cut short: polled below
                for event in client.batch_events(batch_id):
                    if event.event == "batch" and isinstance(event.data, dict):
                        state = event.data
                        show(state)
            while not state or _left(state):
                state = client.batch(batch_id)
                show(state)
                if not _left(state):
                    break
                time.sleep(POLL_S)
            counts = state.get("counts", {})
    except ApiError as exc:
        fail(f"lost track of batch {batch_id}: {exc}", 1)
    except KeyboardInterrupt:
        fail(f"stopped waiting; the batch goes on: tierq batch status {batch_id}", 130)
    bad = {name: counts.get(name, 0) for name in ("failed", "cancelled", "expired")
           if counts.get(name)}
    summary = ", ".join(f"{n} {name}" for name, n in bad.items())
    console.print(f"batch {batch_id} {state.get('status')}: {counts.get('succeeded', 0)} "
                  f"succeeded{', ' + summary if summary else ''}")
    if bad:
        _name_failures(client, batch_id, console)
    if counts.get("failed") or counts.get("expired"):
        raise typer.Exit(1)


# The failed items named after a batch ended, at most (the rest: tierq batch results).
NAMED_FAILURES = 20


def _name_failures(client: Any, batch_id: str, console: Console) -> None:
    """The items that did not succeed, by custom_id (or index), each with its error."""
    from jobs.client.http import ApiError

    shown = 0
    try:
        for line in client.batch_results(batch_id, failed_only=True):
            if shown == NAMED_FAILURES:
                console.print(f"  … and more: tierq batch results {batch_id} --failed")
                return
            name = line.get("custom_id") or f"item {line.get('index')}"
            console.print(f"  {name}: {line.get('status')}: {line.get('error')}",
                          markup=False)
            shown += 1
    except ApiError as exc:
        console.print(f"  (the failed items could not be read: {exc})")


def _left(state: dict[str, Any]) -> int:
    """Items of the batch not ended yet."""
    counts = state.get("counts", {})
    return sum(int(n) for name, n in counts.items() if name not in DONE)


BatchId = Annotated[str, typer.Argument(help="The batch's id.")]


@friendly
def batch_results(
    batch_id: BatchId,
    after: Annotated[int, typer.Option(min=-1, help="Only items past this index.")] = -1,
    failed: Annotated[bool, typer.Option(
        "--failed", help="Only the items that did not succeed (an error file).")] = False,
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Print the batch's finished items as NDJSON, one line each, in index order."""
    with api_client(api_url, key) as client:
        for line in client.batch_results(batch_id, after=after, failed_only=failed):
            sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


@friendly
def batch_status(batch_id: BatchId, api_url: ApiUrl = None, key: ApiKey = None) -> None:
    """Print a batch (as JSON): its items counted by state and the estimated finish."""
    with api_client(api_url, key) as client:
        state = client.batch(batch_id)
    Console(highlight=False, soft_wrap=True).print_json(json.dumps(state))


@friendly
def batch_cancel(batch_id: BatchId, api_url: ApiUrl = None, key: ApiKey = None) -> None:
    """Cancel every item of the batch that has not started."""
    with api_client(api_url, key, announce=True) as client:
        state = client.cancel_batch(batch_id)
    Console(highlight=False, soft_wrap=True).print(cancel_sentence(batch_id, state))


def cancel_sentence(batch_id: str, state: dict[str, Any]) -> str:
    """What a cancel did, in words: "batch B cancelled: 40 items cancelled, 2 still running
    (asked to stop), 8 had already ended"."""
    counts: dict[str, int] = state.get("counts", {})
    parts = [f"{counts.get('cancelled', 0)} item(s) cancelled"]
    running = int(counts.get("running", 0))
    if running:
        parts.append(f"{running} still running (asked to stop)")
    ended = sum(int(counts.get(name, 0)) for name in ("succeeded", "failed", "expired"))
    if ended:
        parts.append(f"{ended} had already ended")
    return f"batch {batch_id} {state.get('status')}: {', '.join(parts)}"


def batch_app() -> typer.Typer:
    batch = typer.Typer(help="Submit batches and read their results (over the API, with a "
                             "tenant key).", no_args_is_help=True)
    batch.command("submit")(batch_submit)
    batch.command("status")(batch_status)
    batch.command("results")(batch_results)
    batch.command("cancel")(batch_cancel)
    return batch
