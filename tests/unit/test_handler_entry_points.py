"""Handlers from the ``tierq.handlers`` entry point group of an installed package: here a
real distribution's metadata (a ``.dist-info`` directory) put on ``sys.path``."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.core.errors import ConfigError
from workers.handlers import ENTRY_POINT_GROUP, default_registry

pytestmark = pytest.mark.unit


def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **points: str) -> None:
    dist = tmp_path / "tierq_extra_handlers-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tierq-extra-handlers\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in points.items())
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_an_entry_point_adds_its_handlers(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path, monkeypatch, testing="tests.handlers_for_tests:BlockingHandler")
    assert "block" in default_registry("").kinds()
    assert "block" not in default_registry("", entry_points=False).kinds()


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("workers.handlers:EchoHandler", "registered twice"),
        ("tests.no_such_module:Handler", "cannot load"),
        ("tests.handlers_for_tests:NoSuchHandler", "cannot load"),
        ("tests.handlers_for_tests:signal", "no 'kind'"),
    ],
)
def test_a_bad_entry_point_stops_the_process_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, match: str
) -> None:
    install(tmp_path, monkeypatch, broken=value)
    with pytest.raises(ConfigError, match=match) as exc:
        default_registry("")
    assert f"{ENTRY_POINT_GROUP}:broken" in exc.value.message
