"""The simulator's figures quoted in docs/policy.md are what `tierq simulate` gives, and the
pictures it links are in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobs.simulate import compare, scenario
from jobs.simulate.report import TierReport
from jobs.simulate.table import seconds
from tests.unit.defaults import default_policy

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy.md"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(title)
    end = text.find("\n### ", start + 1)
    return text[start:end if end > 0 else None]


def _rows(section: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) > 3 and cells[1] in ("strict", "rescore", "tierq"):
            rows[(cells[0], cells[1])] = cells[2:]
    return rows


def _reports(name: str) -> dict[tuple[str, str], TierReport]:
    comparison = compare(default_policy(), scenario.load(name), policies=["strict", "tierq"])
    return {(t.tier, rep.policy): t for rep in comparison.reports for t in rep.tiers}


def _refused(tier: TierReport) -> str:
    if not tier.refused:
        return "-"
    shown = sorted(tier.refused.items(), key=lambda item: -item[1])
    return ", ".join(f"{count:,} {key.split('/')[-1]}" for key, count in shown)


@pytest.mark.parametrize("name", ["seed", "noisy"])
def test_the_quoted_figures_are_the_simulators(name: str) -> None:
    rows = _rows(_section(f"### `{name}`"))
    reports = _reports(name)
    assert set(rows) == set(reports)
    for key, cells in rows.items():
        tier = reports[key]
        assert cells[0] == f"{tier.served:,}", key
        assert cells[1] == _refused(tier), key
        if name == "seed":
            assert cells[2].split()[0] == f"{tier.waiting:,}", key
            gap = "-" if tier.overtaken_gap_s == 0 else f"{seconds(tier.overtaken_gap_s)} s"
            assert cells[4] == gap, key
        else:
            assert tier.waits is not None
            p50 = re.findall(r"[\d,.]+", cells[2])[0]
            assert p50 == seconds(tier.waits.p50), key
            assert cells[3] == f"{tier.peak} / {tier.cap if tier.cap is not None else '-'}"


def test_the_pictures_are_in_the_repository() -> None:
    text = DOC.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert {"img/simulate-seed.png", "img/simulate-noisy.png"} <= set(links)
    for link in links:
        path = DOC.parent / link
        assert path.read_bytes().startswith(b"\x89PNG"), link
