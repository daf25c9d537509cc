"""Scenarios as shipped and as written by hand, and the traffic drawn from them."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest

from jobs.core.errors import ConfigError
from jobs.simulate import scenario
from jobs.simulate.traffic import draw, ordered

pytestmark = pytest.mark.unit


def test_the_named_scenarios_ship_and_load() -> None:
    assert scenario.named() == ["batch", "diurnal", "mixed", "noisy", "packing", "pools", "seed"]
    seed = scenario.load("seed")
    assert seed.pool.workers * seed.pool.slots == 24
    assert seed.service.mean_s == 6.0
    assert seed.tiers() == ["premium", "standard", "free"]
    # premium alone asks more than μ = 24 / 6 = 4 jobs/s
    premium = [s for s in seed.streams if s.tier == "premium"]
    assert sum(s.rate_per_s * s.tenants for s in premium) > 4.0


def test_the_scenarios_are_package_data() -> None:
    data = tomllib.loads(Path("pyproject.toml").read_text())
    assert "simulate/scenarios/*.toml" in data["tool"]["setuptools"]["package-data"]["jobs"]


def test_a_scenario_file_by_path(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time,tenant,tier,service_s\n2.5,acme,premium,3\n1.0,beta,free,7.5\n")
    path = tmp_path / "mine.toml"
    path.write_text('[pool]\nworkers = 1\nslots = 2\n[[streams]]\ntier = "free"\n'
                    'trace = "trace.csv"\n')
    mine = scenario.load(str(path))
    assert mine.name == "mine"
    traffic = draw(mine, 10, seed=1)
    assert traffic.arrival == [1.0, 2.5]
    assert [traffic.tenants[t] for t in traffic.tenant] == ["beta", "acme"]
    assert traffic.service_s == [7.5, 3.0]
    assert ordered(traffic, {"premium": 0, "free": 20}).tiers == ["premium", "free"]


@pytest.mark.parametrize(("text", "message"), [
    ('[[streams]]\ntier = "free"\nrate = 1', "streams[0]: unknown field(s) rate"),
    ('[[streams]]\ntier = "free"\npattern = "poisson"', "needs rate_per_s > 0"),
    ('[service]\ndistribution = "pareto"\n[[streams]]\ntier = "free"\nrate_per_s = 1',
     "service.distribution"),
    ('[pool]\nworkers = 0\nslots = 1\n[[streams]]\ntier = "free"\nrate_per_s = 1',
     "pool: workers >= 1"),
    ('[pool]\nworkers = 2\n[[streams]]\ntier = "free"\nrate_per_s = 1', "pool: missing slots"),
    ("jobs = 3", "has no [[streams]]"),
])
def test_a_bad_scenario_names_its_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text if "[pool]" in text else text + '\n[pool]\nworkers = 1\nslots = 1\n')
    with pytest.raises(ConfigError, match=re.escape(message)):
        scenario.load(str(path))


def test_an_unknown_scenario_lists_the_named_ones() -> None:
    with pytest.raises(ConfigError, match="seed"):
        scenario.load("no-such-scenario")


def test_poisson_rates_and_service_means_come_out_as_configured() -> None:
    seed = scenario.load("seed")
    traffic = draw(seed, 40_000, seed=3)
    span = traffic.arrival[-1]
    assert traffic.arrival == sorted(traffic.arrival)
    total = sum(s.rate_per_s * s.tenants for s in seed.streams)
    assert math.isclose(len(traffic) / span, total, rel_tol=0.03)
    mean = sum(traffic.service_s) / len(traffic)
    assert math.isclose(mean, 6.0, rel_tol=0.03)


def test_lognormal_keeps_its_mean_and_burst_its_size() -> None:
    batch = scenario.load("batch")
    traffic = draw(batch, 60_000, seed=1)
    items = [j for j in range(len(traffic)) if traffic.batch[j]]
    assert len(items) == 50_000
    assert {traffic.arrival[j] for j in items} == {60.0}
    others = [traffic.service_s[j] for j in range(len(traffic)) if not traffic.batch[j]]
    assert math.isclose(sum(others) / len(others), 2.0, rel_tol=0.05)


def test_diurnal_swings_around_its_mean() -> None:
    diurnal = scenario.load("diurnal")
    traffic = draw(diurnal, 30_000, seed=1)
    period = diurnal.streams[0].period_s
    peak = sum(1 for t in traffic.arrival if (t % period) < period / 2)
    trough = len(traffic.arrival) - peak
    assert peak > 3 * trough  # sin > 0 in the first half of each period


def test_failures_draw_retries() -> None:
    seed = scenario.load("seed")
    flaky = scenario.parse({"pool": {"workers": 1, "slots": 1},
                            "service": {"failure_rate": 0.5},
                            "streams": [{"tier": "free", "rate_per_s": 1.0}]}, "flaky", None)
    traffic = draw(flaky, 4_000, seed=1)
    assert math.isclose(sum(traffic.failures) / len(traffic), 1.0, rel_tol=0.1)  # p / (1 - p)
    assert sum(draw(seed, 1_000, seed=1).failures) == 0
