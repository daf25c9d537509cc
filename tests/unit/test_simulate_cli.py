"""`tierq simulate`: the table, the picture, and one red line for each thing a user can get
wrong."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from jobs.cli.main import build_app

pytestmark = pytest.mark.unit

PNG = b"\x89PNG\r\n\x1a\n"
ENV = {"COLUMNS": "220"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TIERQ_"):
            monkeypatch.delenv(name)


@pytest.fixture
def app() -> typer.Typer:
    return build_app()


def _rows(stdout: str) -> dict[tuple[str, str], list[str]]:
    """Rows of the tier table by (tier, policy): the other cells."""
    rows = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) > 10 and cells[0]:  # not a cell's second line
            rows[(cells[0], cells[1])] = cells[2:]
    return rows


def test_simulate_seed_prints_the_table_and_draws_the_png(app: typer.Typer,
                                                         tmp_path: Path) -> None:
    png = tmp_path / "seed.png"
    result = CliRunner().invoke(
        app, ["simulate", "--scenario", "seed", "--jobs", "4000", "--plot", str(png)], env=ENV)
    assert result.exit_code == 0, result.output
    rows = _rows(result.stdout)
    assert set(rows) == {(tier, pol) for tier in ("premium", "standard", "free")
                         for pol in ("strict", "rescore", "tierq")}
    submitted, served = rows[("free", "tierq")][:2]
    assert int(submitted) > 100 and int(served.replace(",", "")) > 0.7 * int(submitted)
    assert int(rows[("free", "strict")][1]) < 0.05 * int(submitted)  # starved
    assert "quota" in rows[("premium", "tierq")][2]  # premium alone is over capacity
    assert "A free job ties with fresh premium work after 120 s" in result.stdout
    assert png.read_bytes().startswith(PNG)
    assert png.stat().st_size > 20_000
    assert f"wrote {png}" in result.stdout


def test_simulate_reads_the_policy_from_the_config(app: typer.Typer, tmp_path: Path) -> None:
    config = tmp_path / "tierq.toml"
    config.write_text("[policy]\nageing_rate_s = 3.0\n")
    result = CliRunner().invoke(
        app, ["simulate", "--config", str(config), "--scenario", "seed", "--jobs", "3000",
              "--policies", "tierq"], env=ENV)
    assert result.exit_code == 0, result.output
    assert "A free job ties with fresh premium work after 60 s" in result.stdout
    assert {pol for _, pol in _rows(result.stdout)} == {"tierq"}


def test_simulate_a_scenario_file(app: typer.Typer, tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('[pool]\nworkers = 1\nslots = 4\n[[streams]]\ntier = "standard"\n'
                    "tenants = 2\nrate_per_s = 0.2\n")
    result = CliRunner().invoke(app, ["simulate", "--scenario", str(mine), "--jobs", "500"],
                                env=ENV)
    assert result.exit_code == 0, result.output
    assert "mine: 500 jobs" in result.stdout
    assert {tier for tier, _ in _rows(result.stdout)} == {"standard"}


@pytest.mark.parametrize(("args", "message"), [
    (["--scenario", "nope"], "no scenario 'nope'"),
    (["--policies", "fifo"], "--policies: choose from strict, rescore, tierq"),
])
def test_simulate_refuses_bad_input_in_one_line(app: typer.Typer, args: list[str],
                                                message: str) -> None:
    result = CliRunner().invoke(app, ["simulate", *args, "--jobs", "100"], env=ENV)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_a_scenario_tier_the_config_lacks_is_named(app: typer.Typer, tmp_path: Path) -> None:
    config = tmp_path / "tierq.toml"
    config.write_text("[tiers.gold]\nbase_priority = 0\nmax_wait_s = 5\ntenant_share = 0.5\n")
    result = CliRunner().invoke(app, ["simulate", "--config", str(config), "--jobs", "100"],
                                env=ENV)
    assert result.exit_code == 2
    assert "premium" in result.stderr and "gold" in result.stderr


def test_plot_without_matplotlib_says_how_to_install_it(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    result = CliRunner().invoke(
        app, ["simulate", "--jobs", "100", "--plot", str(tmp_path / "x.png")], env=ENV)
    assert result.exit_code == 2
    assert result.stderr.strip() == "--plot needs matplotlib: pip install 'tierq[plot]'"
    assert not (tmp_path / "x.png").exists()


def test_simulate_has_help(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["simulate", "--help"], env=ENV)
    assert result.exit_code == 0
    for option in ("--scenario", "--config", "--jobs", "--seed", "--plot", "--policies"):
        assert option in result.stdout
    text = " ".join(result.stdout.replace("│", " ").split())
    assert "(env TIERQ_CONFIG)" in text and "(default: the scenario's)" in text


def test_the_busiest_tenants_show_their_peaks_against_their_caps(app: typer.Typer) -> None:
    result = CliRunner().invoke(
        app, ["simulate", "--scenario", "noisy", "--jobs", "6000", "--policies", "strict,tierq"],
        env=ENV)
    assert result.exit_code == 0, result.output
    loud = next(line for line in result.stdout.splitlines() if line.startswith("│ noisy-0"))
    cells = [cell.strip() for cell in loud.split("│")[1:-1]]
    # tenant, tier, submitted, strict served, strict peak / cap, tierq served, tierq peak / cap
    assert cells[1] == "premium"
    assert int(cells[4].split(" / ")[0]) > 6 and cells[4].endswith("/ -")
    assert cells[6] == "6 / 6"
    assert int(cells[5].replace(",", "")) < int(cells[3].replace(",", ""))
