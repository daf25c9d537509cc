"""What the commands print for a person: commands that work as printed, sentences, hints."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from jobs.cli.batches import cancel_sentence
from jobs.core.errors import InvalidRequest
from jobs.execution.registry import HandlerRegistry
from jobs.process.program import tierq_command


def test_tierq_is_called_by_name_only_where_that_name_finds_this_installation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = Path(sys.executable).parent / "tierq"
    assert script.exists()  # the test suite runs from an installed tierq
    monkeypatch.setenv("PATH", str(tmp_path))  # no venv on PATH: as `make up` runs it
    monkeypatch.chdir(tmp_path)
    assert tierq_command() == str(script)
    monkeypatch.setenv("PATH", str(script.parent) + os.pathsep + str(tmp_path))
    assert tierq_command() == "tierq"


def test_a_batch_cancel_is_told_in_a_sentence() -> None:
    state = {"status": "cancelled", "counts": {"cancelled": 40, "running": 2, "succeeded": 7,
                                               "failed": 1, "waiting": 0}}
    assert cancel_sentence("b-1", state) == (
        "batch b-1 cancelled: 40 item(s) cancelled, 2 still running (asked to stop), "
        "8 had already ended")


def test_a_kind_of_an_extra_not_installed_says_what_to_install() -> None:
    with pytest.raises(InvalidRequest, match=r"pip install 'tierq\[models\]'"):
        HandlerRegistry([]).get("document.embed")
    with pytest.raises(InvalidRequest) as plain:
        HandlerRegistry([]).get("no.such.kind")
    assert "pip install" not in plain.value.message


def test_the_example_run_comes_out_of_the_installed_package(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from jobs.cli.main import build_app

    out = tmp_path / "ex"
    result = CliRunner().invoke(build_app(), ["examples", str(out)])
    assert result.exit_code == 0, result.output
    root = Path(__file__).resolve().parents[2] / "examples"
    for name in ("sts-mini.jsonl", "correlation.py", "README.md"):
        assert (out / name).read_bytes() == (root / name).read_bytes()
    assert f"batch submit {out / 'sts-mini.jsonl'} --kind eval.similarity --wait" in (
        result.output)
    again = CliRunner().invoke(build_app(), ["examples", str(out)])
    assert again.exit_code == 2 and "exists already" in again.output


def test_up_prints_what_its_slots_give_each_tier_and_warns_of_ones() -> None:
    from jobs.local.banner import derived_lines
    from jobs.local.up import UpOptions
    from jobs.process.settings import load_settings

    small = derived_lines(load_settings(), UpOptions(concurrency=2))
    # Premium's Little's-law bound is 1 there; the pool's 2 slots floor it.
    assert small[0].startswith("Bound/cap/quota: premium 2/1/1 · standard 6/1/1")
    assert "warning: a figure of 1 (premium, standard, free)" in small[1]
    roomy = derived_lines(load_settings(policy={"mean_service_s": 0.5}),
                          UpOptions(concurrency=50))
    assert roomy == [roomy[0]] and "premium 500/12/125" in roomy[0]
