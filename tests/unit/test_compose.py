"""docker-compose.yml stays runnable: every `tierq …` command parses against the real CLI,
every tierq service reaches the same database and Redis, and start order is healthy."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import typer.exceptions
import typer.main
import yaml

from jobs.cli import build_app

pytestmark = pytest.mark.unit

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def services() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(COMPOSE.read_text())
    result: dict[str, dict[str, Any]] = data["services"]
    return result


def argv(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def tierq_services() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services().items() if argv(s)[:1] == ["tierq"]}


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


# Typer may vendor its own click: accept either family of usage errors.
USAGE_ERRORS = (LookupError, click.UsageError, typer.exceptions.TyperException)


def resolve(args: list[str]) -> Any:
    """Parse ``args`` as the CLI would (unknown commands or options raise), without running."""
    command: Any = typer.main.get_command(build_app())
    rest = list(args)
    while hasattr(command, "commands"):  # a group: the next word names a subcommand
        if not rest or rest[0] not in command.commands:
            raise LookupError(f"no subcommand {rest[:1]} in {sorted(command.commands)}")
        command = command.commands[rest.pop(0)]
    command.make_context(command.name, rest)
    return command


def test_the_expected_services_are_declared() -> None:
    assert set(services()) == {
        "postgres", "redis", "migrate", "api", "dispatcher", "worker", "flower",
    }
    assert set(tierq_services()) == {"migrate", "api", "dispatcher", "worker", "flower"}


@pytest.mark.parametrize("name", sorted(tierq_services()))
def test_each_tierq_command_is_a_real_subcommand(name: str) -> None:
    args = argv(tierq_services()[name])[1:]
    command = resolve(args)
    assert command.name == args[0]


def test_an_unknown_subcommand_is_caught() -> None:
    with pytest.raises(USAGE_ERRORS):
        resolve(["frobnicate"])
    with pytest.raises(USAGE_ERRORS):
        resolve(["api", "--no-such-option"])
    with pytest.raises(USAGE_ERRORS):
        resolve(["worker", "--concurrency", "many"])


@pytest.mark.parametrize("name", sorted(tierq_services()))
def test_each_tierq_service_has_database_and_redis_urls(name: str) -> None:
    service = tierq_services()[name]
    env = environment(service)
    assert env["TIERQ_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in env["TIERQ_DATABASE_URL"]
    assert env["TIERQ_REDIS_URL"].startswith("redis://redis:6379")
    assert "TIERQ_ADMIN_KEY" in env
    assert service.get("build") is not None


def test_dependencies_wait_for_health_and_migrations() -> None:
    declared = services()
    for name, service in declared.items():
        for dep, rule in service.get("depends_on", {}).items():
            assert dep in declared, f"{name} depends on unknown {dep}"
            condition = rule["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in declared[dep], f"{dep} has no healthcheck"
            else:
                assert condition == "service_completed_successfully"
    for name in ("api", "dispatcher", "worker", "flower"):
        rules = declared[name]["depends_on"]
        assert rules["migrate"]["condition"] == "service_completed_successfully"
        assert rules["postgres"]["condition"] == "service_healthy"
        assert rules["redis"]["condition"] == "service_healthy"
    assert "/readyz" in " ".join(declared["api"]["healthcheck"]["test"])
