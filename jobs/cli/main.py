"""The ``tierq`` command: only the wiring of the command modules, one per group, so each stays
small and none imports another's commands. Heavy imports (the API, Celery) happen inside the
commands that need them, so ``tierq --help`` and ``tierq policy`` stay quick.
"""

from __future__ import annotations

import typer

from jobs.cli import jobs, run, tenants, webhooks
from jobs.cli.batches import batch_app
from jobs.cli.common import global_options
from jobs.cli.examples import examples
from jobs.cli.policy import show_policy
from jobs.cli.simulate import simulate


def build_app() -> typer.Typer:
    """The command tree (``main`` runs it; tests introspect it)."""
    app = typer.Typer(
        name="tierq",
        help="tierq: a durable, tiered job scheduler for expensive (GPU) work.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
    )
    app.callback()(global_options)
    for command in (run.up, run.api, run.dispatcher, run.worker, run.flower, run.migrate,
                    jobs.submit, jobs.upload, jobs.status, run.repair, examples):
        app.command()(command)
    app.command("policy")(show_policy)
    app.add_typer(tenants.tenants_app(), name="tenants")
    app.add_typer(jobs.jobs_app(), name="jobs")
    app.add_typer(batch_app(), name="batch")
    app.add_typer(webhooks.webhooks_app(), name="webhooks")
    app.command("simulate")(simulate)
    return app


def main() -> None:
    build_app()(prog_name="tierq")


if __name__ == "__main__":
    main()
