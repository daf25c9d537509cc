"""``tierq webhooks``: a tenant's signing secret, its rotation, and what was delivered for a
job, over the API with the tenant's key."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from jobs.cli.common import ApiKey, ApiUrl, api_client, fail, friendly

WebhookUrl = Annotated[str | None, typer.Option(
    "--webhook", show_default=False,
    help="POST the job's events to this URL, signed (tierq webhooks secret).")]
WebhookEvents = Annotated[list[str] | None, typer.Option(
    "--webhook-event", show_default=False,
    help="An event to post: started, completed (repeat it; default: completed).")]


def webhook_of(url: str | None, events: list[str] | None) -> dict[str, Any] | None:
    """The ``webhook`` a command's options name (None: no webhook)."""
    if url is None:
        if events:
            fail("--webhook-event names the events of a --webhook URL", 2)
        return None
    return {"url": url, "events": events} if events else {"url": url}


@friendly
def secret(api_url: ApiUrl = None, key: ApiKey = None) -> None:
    """Print the secret (whsec_…) that signs this tenant's webhooks."""
    with api_client(api_url, key) as client:
        answer = client.webhook_secret()
    _print_secret(answer)


@friendly
def rotate(api_url: ApiUrl = None, key: ApiKey = None) -> None:
    """Make a new signing secret; the old one signs beside it for 24 hours."""
    with api_client(api_url, key, announce=True) as client:
        answer = client.rotate_webhook_secret()
    _print_secret(answer)


def _print_secret(answer: dict[str, Any]) -> None:
    console = Console(highlight=False, soft_wrap=True)
    console.print(str(answer.get("secret")))
    until = answer.get("previous_valid_until")
    if until:
        console.print(f"the previous secret also signs until {until}", style="dim")


@friendly
def deliveries(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    api_url: ApiUrl = None,
    key: ApiKey = None,
) -> None:
    """Each webhook event of a job, and every try: when, the status code or the error."""
    with api_client(api_url, key) as client:
        found = client.deliveries(job_id)["deliveries"]
    console = Console(highlight=False, soft_wrap=True)
    if not found:
        console.print(f"job {job_id}: no webhook event recorded")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("webhook-id", "type", "status", "try", "at", "answer"):
        table.add_column(column, no_wrap=column in ("webhook-id", "at"))
    for event in found:
        tries = event.get("attempts") or [None]
        for n, attempt in enumerate(tries, start=1):
            answer = "" if attempt is None else (
                str(attempt.get("status_code") or "") + (
                    f" {attempt['error']}" if attempt.get("error") else "")).strip()
            table.add_row(event["webhook_id"] if n == 1 else "", event["type"] if n == 1 else "",
                          event["status"] if n == 1 else "", "" if attempt is None else str(n),
                          "" if attempt is None else str(attempt.get("at")), answer)
        if event.get("next_attempt_at"):
            table.add_row("", "", "", "next", str(event["next_attempt_at"]), "")
    console.print(table)


def webhooks_app() -> typer.Typer:
    app = typer.Typer(help="Webhooks: the signing secret, and what was delivered (over the "
                      "API, with a tenant key).", no_args_is_help=True)
    app.command("secret")(secret)
    app.command("rotate")(rotate)
    app.command("deliveries")(deliveries)
    return app
