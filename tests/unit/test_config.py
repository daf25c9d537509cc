"""Settings: TOML file, environment overrides, and refusals that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.config import load_settings
from jobs.errors import ConfigError

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
