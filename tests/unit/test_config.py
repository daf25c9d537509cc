"""Settings: TOML file, environment overrides, and refusals that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.core.errors import ConfigError
from jobs.process.settings import load_settings

pytestmark = pytest.mark.unit

API_EXAMPLE = """
[policy]
ageing_rate_s = 6.0
pool_concurrency = 24
mean_service_s = 6.0
lease_ttl_s = 30

[tiers.premium]
base_priority = 0
max_wait_s = 5
tenant_share = 0.25
[tiers.standard]
base_priority = 10
max_wait_s = 20
tenant_share = 0.10
[tiers.free]
base_priority = 20
max_wait_s = 60
tenant_share = 0.04
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("TIERQ_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tierq.toml"
    path.write_text(text)
    monkeypatch.setenv("TIERQ_CONFIG", str(path))
    return path


def test_defaults_are_the_three_documented_tiers() -> None:
    pol = load_settings().build_policy()
    assert list(pol.tiers) == ["premium", "standard", "free"]
    assert pol.ageing_rate_s == 6.0
    assert pol.pool_concurrency is None


def test_the_api_example_file_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, API_EXAMPLE, monkeypatch)
    pol = load_settings().build_policy()
    assert pol.pool_concurrency == 24
    assert pol.tiers["standard"].tenant_share == 0.10


def test_environment_overrides_one_field_of_a_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, API_EXAMPLE, monkeypatch)
    monkeypatch.setenv("TIERQ_TIERS__FREE__MAX_WAIT_S", "30")
    monkeypatch.setenv("TIERQ_POLICY__AGEING_RATE_S", "3")
    pol = load_settings().build_policy()
    assert pol.tiers["free"].max_wait_s == 30
    assert pol.tiers["free"].base_priority == 20
    assert pol.ageing_rate_s == 3


def test_environment_alone_overrides_a_default_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERQ_TIERS__FREE__MAX_WAIT_S", "90")
    assert load_settings().build_policy().tiers["free"].max_wait_s == 90


def test_retention_defaults_to_a_week_and_zero_keeps_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIERQ_TIERS__FREE__RETENTION_S", "0")
    tiers = load_settings().build_policy().tiers
    assert tiers["premium"].retention_s == 7 * 86400
    assert tiers["free"].retention_s == 0


def test_a_file_with_its_own_tiers_replaces_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        tmp_path,
        "[tiers.gold]\nbase_priority = 0\nmax_wait_s = 10\ntenant_share = 0.5\n",
        monkeypatch,
    )
    assert list(load_settings().tiers) == ["gold"]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (
            "[tiers.free]\nbase_priority = 20\nmax_wait_s = 60\ntenant_share = 0\n",
            "tiers.free.tenant_share",
        ),
        (
            "[tiers.free]\nbase_priority = 20\nmax_wait_s = -1\ntenant_share = 0.1\n",
            "tiers.free.max_wait_s",
        ),
        (
            "[tiers.free]\nbase_priority = 20\nmax_wait_s = 5\ntenant_share = 1.5\n",
            "tiers.free.tenant_share",
        ),
        ("[tiers.free]\nmax_wait_s = 5\ntenant_share = 0.5\n", "tiers.free.base_priority"),
        (
            "[tiers.free]\nbase_priority = 20\nmax_wait_s = 5\ntenant_share = 0.5\n"
            "retention_s = -1\n",
            "tiers.free.retention_s",
        ),
        ("[policy]\nageing_rate_s = 0\n", "policy.ageing_rate_s"),
        ("[policy]\npool_concurrency = 0\n", "policy.pool_concurrency"),
        ("[policy]\nlease_ttl_s = -5\n", "policy.lease_ttl_s"),
        ("[policy]\nnot_a_setting = 1\n", "policy.not_a_setting"),
        ('[tiers.""]\nbase_priority = 0\nmax_wait_s = 5\ntenant_share = 0.5\n', "tiers."),
        ("[tiers]\n", "tiers"),
    ],
)
def test_impossible_values_stop_with_the_field_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, field: str
) -> None:
    write(tmp_path, text, monkeypatch)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_settings()


def test_a_bad_environment_value_names_the_variable_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERQ_POLICY__MEAN_SERVICE_S", "-1")
    with pytest.raises(ConfigError, match=r"policy\.mean_service_s"):
        load_settings()


def test_an_unreadable_or_invalid_file_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERQ_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings()
    write(tmp_path, "[policy\n", monkeypatch)
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings()


@pytest.mark.parametrize("key", [
    "change-me", "changeme", "Change_Me", "admin", "secret", "password",
    "change-me-to-a-long-random-key", "<replace-me with a real key>",
])
def test_a_known_default_admin_key_is_refused(key: str) -> None:
    with pytest.raises(ConfigError, match="TIERQ_ADMIN_KEY is a known default or placeholder"):
        load_settings(admin_key=key)


def test_a_short_admin_key_is_refused_without_echoing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERQ_ADMIN_KEY", "k3y-0f-15-chars")
    with pytest.raises(ConfigError, match="TIERQ_ADMIN_KEY is 15 characters, fewer than 16") as err:
        load_settings()
    assert "k3y-0f-15-chars" not in str(err.value)


def test_a_long_random_admin_key_is_taken_and_an_empty_one_means_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import secrets

    key = secrets.token_urlsafe(12)  # 16 characters: the shortest accepted
    assert load_settings(admin_key=key).admin_key == key
    monkeypatch.setenv("TIERQ_ADMIN_KEY", "")
    assert load_settings().admin_key is None


def test_a_placeholder_admin_key_stops_the_cli_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from jobs.cli.main import build_app

    monkeypatch.setenv("TIERQ_ADMIN_KEY", "change-me")
    result = CliRunner().invoke(build_app(), ["policy"], env={"COLUMNS": "400"})
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "TIERQ_ADMIN_KEY" in lines[0], result.output
