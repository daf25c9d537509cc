"""The `tierq` command line: the policy table, refusals of bad input, every command's help."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from jobs.cli.main import build_app

pytestmark = pytest.mark.unit

COMMANDS = [
    ["up"],
    ["api"],
    ["dispatcher"],
    ["worker"],
    ["flower"],
    ["migrate"],
    ["tenants"],
    ["tenants", "create"],
    ["tenants", "list"],
    ["submit"],
    ["status"],
    ["policy"],
    ["jobs", "list"],
    ["jobs", "get"],
    ["jobs", "result"],
    ["jobs", "cancel"],
    ["tenants", "update"],
    ["tenants", "rotate-key"],
    ["repair"],
]
# Nothing listens on port 1: Redis is unreachable at once.
NO_REDIS = {"TIERQ_REDIS_URL": "redis://127.0.0.1:1", "COLUMNS": "200"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TIERQ_"):
            monkeypatch.delenv(name)


@pytest.fixture
def app() -> typer.Typer:
    return build_app()


def _rows(stdout: str) -> dict[str, list[str]]:
    """Every table row, by its first cell: the other cells."""
    return {
        line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
        for line in stdout.splitlines()
        if line.startswith("│") and line.split("│")[1].strip()
    }


def test_policy_prints_the_worked_example(app: typer.Typer) -> None:
    env = {**NO_REDIS, "TIERQ_POLICY__POOL_CONCURRENCY": "24"}
    result = CliRunner().invoke(app, ["policy"], env=env)
    assert result.exit_code == 0, result.output
    rows = _rows(result.stdout)
    # tier: priority, max wait, bound, cap, quota (each configured then live), rate, ageing,
    # admitted jobs/s (live)
    assert rows["premium"] == ["0", "5", "24", "-", "6", "-", "6", "-", "-", "0 s", "-"]
    assert rows["standard"] == ["10", "20", "80", "-", "2", "-", "8", "-", "-", "60 s", "-"]
    assert rows["free"] == ["20", "60", "240", "-", "1", "-", "9", "-", "-", "120 s", "-"]
    # figure: configured, live
    assert rows["capacity"] == ["24", "-"]
    assert rows["mean service time"] == ["6 s", "-"]
    assert rows["service rate μ"] == ["4 jobs/s", "-"]
    assert "A free job ties with fresh premium work after 120 s." in result.stdout
    assert "not reachable: configured figures only" in result.stdout


def test_policy_shows_each_tiers_rate_limit(app: typer.Typer) -> None:
    env = {**NO_REDIS, "TIERQ_TIERS__FREE__RATE_PER_S": "0.5"}
    result = CliRunner().invoke(app, ["policy"], env=env)
    assert result.exit_code == 0, result.output
    assert _rows(result.stdout)["free"][-3] == "0.5 (burst 1)"


def test_policy_without_pool_size_or_redis_says_capacity_is_unknown(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["policy"], env=NO_REDIS)
    assert result.exit_code == 0, result.output
    rows = _rows(result.stdout)
    assert rows["capacity"] == ["-", "-"]
    assert rows["free"][2:8] == ["-"] * 6
    assert "A free job ties with fresh premium work after 120 s." in result.stdout


def test_a_bad_configuration_exits_2_naming_the_field(app: typer.Typer) -> None:
    env = {**NO_REDIS, "TIERQ_TIERS__FREE__TENANT_SHARE": "0"}
    result = CliRunner().invoke(app, ["policy"], env=env)
    assert result.exit_code == 2
    assert "tiers.free.tenant_share" in result.stderr
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("payload", ["{not json", "[1, 2]", "3"])
def test_submit_refuses_a_payload_that_is_not_a_json_object(
    app: typer.Typer, payload: str
) -> None:
    args = ["submit", "echo", "--payload", payload, "--key", "k", "--api", "http://127.0.0.1:1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--payload" in result.stderr
    assert "Traceback" not in result.output


def test_submit_without_a_key_exits_2(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["submit", "echo", "--api", "http://127.0.0.1:1"])
    assert result.exit_code == 2
    assert "TIERQ_API_KEY" in result.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(app: typer.Typer, command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Usage: tierq " + " ".join(command) in result.stdout


@pytest.fixture
def flower_runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """``tierq flower`` with Flower itself replaced: the arguments it would have run with."""
    import workers.flower

    for name in list(os.environ):
        if name.startswith("FLOWER_"):
            monkeypatch.delenv(name)
    runs: list[dict[str, object]] = []
    monkeypatch.setattr(workers.flower, "run_flower", lambda _settings, **kw: runs.append(kw))
    return runs


def test_flower_listens_on_localhost_unless_told(
    app: typer.Typer, flower_runs: list[dict[str, object]]
) -> None:
    from workers.flower import flower_argv

    result = CliRunner().invoke(app, ["flower"])
    assert result.exit_code == 0, result.output
    assert flower_runs == [{"port": 5555, "address": "127.0.0.1"}]
    assert "warning" not in result.output
    # Flower's own default address ('') is every interface: always pass one.
    assert flower_argv(port=5555, address="127.0.0.1") == [
        "flower", "--port=5555", "--address=127.0.0.1",
    ]


def test_flower_refuses_to_listen_further_without_auth(
    app: typer.Typer, flower_runs: list[dict[str, object]]
) -> None:
    bare = CliRunner().invoke(app, ["flower", "--address", "0.0.0.0"], env={"COLUMNS": "200"})
    assert bare.exit_code == 2, bare.output
    lines = bare.stderr.strip().splitlines()
    assert len(lines) == 1 and "no authentication" in lines[0] and "FLOWER_BASIC_AUTH" in lines[0]
    malformed = CliRunner().invoke(
        app, ["flower", "--address", "0.0.0.0"], env={"FLOWER_BASIC_AUTH": "admin"}
    )
    assert malformed.exit_code == 2 and "user:password" in malformed.stderr, malformed.output
    protected = CliRunner().invoke(
        app, ["flower", "--address", "0.0.0.0"], env={"FLOWER_BASIC_AUTH": "admin:long-secret"}
    )
    assert protected.exit_code == 0, protected.output
    assert [run["address"] for run in flower_runs] == ["0.0.0.0"]


def test_run_flower_itself_refuses_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard sits in ``workers.flower``, not only in the command: any caller is stopped."""
    import workers.flower
    from jobs.core.errors import ConfigError
    from jobs.process.settings import load_settings

    for name in list(os.environ):
        if name.startswith("FLOWER_"):
            monkeypatch.delenv(name)
    started: list[object] = []
    monkeypatch.setattr(workers.flower, "make_celery", started.append)
    settings = load_settings(database_url="sqlite:///:memory:", redis_url="redis://127.0.0.1:1")
    for address in ("0.0.0.0", "", "flower.example.org", "::"):
        with pytest.raises(ConfigError, match="no authentication"):
            workers.flower.run_flower(settings, port=5555, address=address)
    assert started == []


def test_flower_help_says_how_to_protect_it(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["flower", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "127.0.0.1" in result.stdout and "FLOWER_BASIC_AUTH=user:password" in result.stdout


# -- errors are one line --------------------------------------------------------------------


def test_version(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip().startswith("tierq ")


def test_a_max_wait_that_is_not_a_number_is_one_line(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["submit", "echo", "--max-wait", "nan"])
    assert result.exit_code == 2
    assert result.output.strip() == "--max-wait must be a positive number of seconds, not nan"


def test_a_database_without_the_schema_is_one_line(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERQ_DATABASE_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    result = CliRunner().invoke(app, ["tenants", "list"], env=NO_REDIS)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "run `tierq migrate` first" in lines[0], result.output
    assert "Traceback" not in result.output


def test_migrate_waits_for_the_database_then_says_why_in_one_line(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERQ_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/nothing")
    result = CliRunner().invoke(app, ["migrate", "--wait", "1.5"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines[0] == "→ database postgresql://postgres@127.0.0.1:1/nothing"  # what it acts on
    assert lines[1].startswith("waiting for the database: ")  # it tried more than once
    assert lines[-1].startswith("the database cannot be reached: ")
    assert "Traceback" not in result.output


def test_debug_shows_the_error_a_line_stands_for(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one line hides a traceback; ``--debug`` lets it through, for a bug report."""
    from jobs.cli import common

    monkeypatch.setitem(common.DEBUG, "on", False)  # restored after: --debug sets it
    monkeypatch.setenv("TIERQ_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/nothing")
    plain = CliRunner().invoke(app, ["migrate", "--wait", "0.2"])
    debug = CliRunner().invoke(app, ["--debug", "migrate", "--wait", "0.2"])

    assert plain.exit_code == 1 and isinstance(plain.exception, SystemExit)
    assert "Traceback" not in plain.output
    assert debug.exit_code == 1 and not isinstance(debug.exception, SystemExit)
    assert "127.0.0.1" in str(debug.exception)  # the driver's own error, with its traceback
    assert debug.exc_info is not None and debug.exc_info[2] is not None


# -- one way to find the system --------------------------------------------------------------

NEEDS_THE_SYSTEM = [
    (["tenants", "list"], "no tierq database found"),
    (["tenants", "create", "acme", "--tier", "free"], "no tierq database found"),
    (["tenants", "rotate-key", "acme"], "no tierq database found"),
    (["repair"], "no tierq database found"),
    (["dispatcher"], "no tierq database found"),
    (["worker"], "no tierq database found"),
    (["api"], "no tierq database found"),
    (["submit", "echo", "--key", "k"], "no tierq API found"),
    (["jobs", "list", "--key", "k"], "no tierq API found"),
    (["status", "some-id", "--key", "k"], "no tierq API found"),
]


@pytest.mark.parametrize(("command", "says"), NEEDS_THE_SYSTEM,
                         ids=[" ".join(command) for command, _ in NEEDS_THE_SYSTEM])
def test_with_nothing_configured_every_command_refuses_in_one_line_and_creates_nothing(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str],
    says: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, command, env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(says), result.output
    assert "TIERQ_" in lines[0] and "--data-dir" in lines[0]  # and what to set instead
    assert list(tmp_path.iterdir()) == []  # no fresh SQLite file, no data directory


def test_a_database_but_no_running_redis_is_refused_not_replaced_by_a_local_one(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tierq").mkdir()
    (tmp_path / ".tierq" / "tierq.db").touch()  # a stopped `tierq up`: its database stays
    result = CliRunner().invoke(app, ["dispatcher"], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert result.output.startswith("no Redis found: the default data directory "
                                    f"{tmp_path / '.tierq'} has no running `tierq up`")


def test_policy_without_a_system_says_so_instead_of_showing_zero_workers(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["policy"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "no Redis found" in result.output and "configured figures only" in result.output
    assert "live workers" not in result.output.replace("the live workers", "")


def test_the_flag_wins_over_the_environment_and_migrate_names_its_target(
    app: typer.Typer, tmp_path: Path
) -> None:
    env = {"TIERQ_DATA_DIR": str(tmp_path / "from-env"), "COLUMNS": "300"}
    result = CliRunner().invoke(app, ["--data-dir", str(tmp_path / "from-flag"), "migrate"],
                                env=env)
    assert result.exit_code == 0, result.output
    assert f"→ database sqlite:///{tmp_path / 'from-flag' / 'tierq.db'}" in result.output
    assert (tmp_path / "from-flag" / "tierq.db").exists()
    assert not (tmp_path / "from-env").exists()


def test_the_environment_wins_over_the_config_file_which_wins_over_the_data_dir(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "tierq.toml"
    config.write_text(f'database_url = "sqlite:///{tmp_path / "from-file.db"}"\n')
    (tmp_path / ".tierq").mkdir()
    (tmp_path / ".tierq" / "tierq.db").touch()
    from_file = CliRunner().invoke(app, ["--config", str(config), "migrate"],
                                   env={"COLUMNS": "300"})
    assert from_file.exit_code == 0, from_file.output
    assert f"→ database sqlite:///{tmp_path / 'from-file.db'}" in from_file.output
    env = {"TIERQ_DATABASE_URL": f"sqlite:///{tmp_path / 'from-env.db'}", "COLUMNS": "300"}
    from_env = CliRunner().invoke(app, ["--config", str(config), "migrate"], env=env)
    assert from_env.exit_code == 0, from_env.output
    assert f"→ database sqlite:///{tmp_path / 'from-env.db'}" in from_env.output


def test_a_stopped_tierq_up_is_not_taken_for_a_running_one(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import subprocess

    dead = subprocess.Popen(["true"])  # a pid whose process has exited
    dead.wait()
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tierq").mkdir()
    (tmp_path / ".tierq" / "up.json").write_text(
        json.dumps({"api_url": "http://127.0.0.1:9", "pid": dead.pid}))
    result = CliRunner().invoke(app, ["jobs", "list", "--key", "k"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and result.output.startswith("no tierq API found"), result.output


def test_the_jobs_table_fits_the_terminal_and_never_cuts_an_id_or_a_status() -> None:
    from rich.console import Console

    from jobs.cli.jobs import jobs_table

    job = {"id": "01a22fe3-b169-7e99-8fd7-08b52bad2048", "kind": "document.embed",
           "status": "dispatched", "attempt": 2, "created_at": "2026-12-01T04:36:20.1+00:00",
           "enqueued_at": "2026-12-01T04:36:20.1+00:00",
           "started_at": "2026-12-01T04:36:21.6+00:00", "error": "RuntimeError: " + "x" * 300}
    for width in (50, 80, 120, 200):
        console = Console(width=width)
        with console.capture() as captured:
            console.print(jobs_table([job], width))
        lines = captured.get().splitlines()
        assert max(len(line) for line in lines) <= max(width, 48), (width, lines)
        assert job["id"] in lines[1] and "dispatched" in lines[1]
    assert "1.5 s" in lines[1] and "document.embed" in lines[1]  # the widest shows them all


@pytest.mark.parametrize("option", ["--cap", "--max-queued", "--rate-burst"])
def test_tenant_overrides_beyond_what_a_column_holds_are_refused_before_any_io(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["tenants", "update", "acme", option, str(2**63)],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and option in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_rate_that_is_not_a_finite_positive_number_is_refused(app: typer.Typer) -> None:
    for rate in ("nan", "inf", "-1", "1e300"):
        result = CliRunner().invoke(app, ["tenants", "update", "acme", "--rate-per-s", rate])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("--rate-per-s must be a number in (0, 1e+06]")
