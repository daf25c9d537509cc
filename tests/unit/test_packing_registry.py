"""Which kinds pack, and how much: the registry's ``packing(kind)``, the handler's own
declaration under the configuration's ``[kinds."<kind>"]``, and the settings that carry it."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core.errors import ConfigError
from jobs.process.settings import KindSettings, load_settings
from workers.handlers import (
    HandlerRegistry,
    JobContext,
    Packing,
    default_registry,
    kind_packing,
)
from workers.tasks import WorkerResources

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TIERQ_"):
            monkeypatch.delenv(name)


class Alone:
    """A handler that runs one job at a time."""

    kind = "text.alone"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        return payload


class Packs(Alone):
    """A handler that packs, with or without a declared size."""

    kind = "text.packs"

    def __init__(self, max_items: int | None = 8) -> None:
        if max_items is not None:
            self.max_items_per_run = max_items

    def run_many(self, contexts: list[JobContext], payloads: list[dict[str, Any]]) -> list[Any]:
        return list(payloads)


class Budgeted(Packs):
    """A handler that packs under a budget of characters."""

    kind = "text.budgeted"
    max_cost_per_run = 1000

    def cost(self, payload: dict[str, Any]) -> int:
        return len(str(payload.get("text", "")))


def registry(*handlers: Any, kinds: dict[str, KindSettings] | None = None) -> HandlerRegistry:
    built = HandlerRegistry(handlers)
    if kinds is not None:
        built.configure_packing(kinds)
    return built


def test_a_handler_without_run_many_and_an_unknown_kind_do_not_pack() -> None:
    reg = registry(Alone())
    assert reg.packing("text.alone") is None
    assert reg.packing("no.such.kind") is None
    assert default_registry("", entry_points=False).packing("sleep") is None


def test_a_handler_packs_by_its_own_declaration() -> None:
    assert registry(Packs(8)).packing("text.packs") == Packing(max_items=8)
    assert registry(Packs(None)).packing("text.packs") is None  # run_many alone: not on
    assert registry(Packs(1)).packing("text.packs") is None
    packing = registry(Budgeted()).packing("text.budgeted")
    assert packing is not None
    assert (packing.max_items, packing.max_cost) == (8, 1000)
    assert packing.cost_of({"text": "four"}) == 4


def test_the_configuration_overrides_a_kind_and_1_turns_packing_off() -> None:
    assert registry(Packs(8), kinds={"text.packs": KindSettings(max_items_per_run=64)}
                    ).packing("text.packs") == Packing(max_items=64)
    assert registry(Packs(8), kinds={"text.packs": KindSettings(max_items_per_run=1)}
                    ).packing("text.packs") is None
    # run_many without a size of its own: the configuration turns packing on.
    assert registry(Packs(None), kinds={"text.packs": KindSettings(max_items_per_run=3)}
                    ).packing("text.packs") == Packing(max_items=3)
    budget = registry(Budgeted(), kinds={"text.budgeted": KindSettings(max_cost_per_run=20)}
                      ).packing("text.budgeted")
    assert budget is not None and (budget.max_items, budget.max_cost) == (8, 20)


def test_an_override_a_handler_cannot_follow_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kinds = {
        "text.alone": KindSettings(max_items_per_run=64),  # no run_many
        "text.packs": KindSettings(max_cost_per_run=500),  # no cost()
        "kind.of.another.pool": KindSettings(max_items_per_run=64),  # not run here: quiet
    }
    with caplog.at_level(logging.WARNING, logger="tierq.worker"):
        reg = registry(Alone(), Packs(8), kinds=kinds)
    assert reg.packing("text.alone") is None
    assert reg.packing("text.packs") == Packing(max_items=8)
    assert reg.packing("kind.of.another.pool") is None
    ignored = sorted((r.kind, r.field) for r in caplog.records  # type: ignore[attr-defined]
                     if getattr(r, "event", "") == "worker.kind_setting_ignored")
    assert ignored == [("text.alone", "max_items_per_run"), ("text.packs", "max_cost_per_run")]


@pytest.mark.parametrize("value", [0, -3, True, 2.5, "4"])
def test_a_declared_size_that_is_not_a_whole_number_stops_the_process(value: object) -> None:
    handler = Packs()
    handler.max_items_per_run = value  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"text\.packs.*max_items_per_run"):
        registry(handler)


def test_a_declaration_without_the_method_it_needs_stops_the_process() -> None:
    alone = Alone()
    alone.max_items_per_run = 4  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="no run_many"):
        registry(alone)
    packs = Packs()
    packs.max_cost_per_run = 100  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="no cost"):
        kind_packing(packs)


SIZES = st.none() | st.integers(min_value=1, max_value=200)


@given(own=SIZES, configured=SIZES, has_run_many=st.booleans(), own_cost=SIZES,
       configured_cost=SIZES)
def test_the_effective_packing_is_the_configuration_over_the_handler(
    own: int | None, configured: int | None, has_run_many: bool, own_cost: int | None,
    configured_cost: int | None,
) -> None:
    handler: Any = Budgeted(own) if has_run_many else Alone()
    if has_run_many:
        handler.max_cost_per_run = own_cost
    kinds = {handler.kind: KindSettings(max_items_per_run=configured,
                                        max_cost_per_run=configured_cost)}
    packing = registry(handler, kinds=kinds).packing(handler.kind)
    effective = configured if configured is not None else own
    if not has_run_many or effective is None or effective < 2:
        assert packing is None
        return
    assert packing is not None
    assert packing.max_items == effective
    assert packing.max_cost == (configured_cost if configured_cost is not None else own_cost)


def test_the_settings_read_kinds_from_toml_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "tierq.toml"
    path.write_text('[kinds."eval.similarity"]\nmax_items_per_run = 64\n'
                    'max_cost_per_run = 20000\n[kinds."document.embed"]\nmax_items_per_run = 1\n')
    monkeypatch.setenv("TIERQ_CONFIG", str(path))
    monkeypatch.setenv("TIERQ_KINDS__EVAL.SIMILARITY__MAX_COST_PER_RUN", "500")
    kinds = load_settings().kinds
    assert kinds == {
        "eval.similarity": KindSettings(max_items_per_run=64, max_cost_per_run=500),
        "document.embed": KindSettings(max_items_per_run=1),
    }
    monkeypatch.delenv("TIERQ_CONFIG")
    assert load_settings().kinds == {"eval.similarity": KindSettings(max_cost_per_run=500)}
    monkeypatch.delenv("TIERQ_KINDS__EVAL.SIMILARITY__MAX_COST_PER_RUN")
    assert load_settings().kinds == {}


@pytest.mark.parametrize(("body", "field"), [
    ('[kinds."eval.similarity"]\nmax_items_per_run = 0\n', "max_items_per_run"),
    ('[kinds."eval.similarity"]\nmax_cost_per_run = -1\n', "max_cost_per_run"),
    ('[kinds."eval.similarity"]\nbatch_size = 3\n', "batch_size"),
])
def test_a_kind_setting_that_cannot_work_names_its_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, field: str,
) -> None:
    path = tmp_path / "tierq.toml"
    path.write_text(body)
    monkeypatch.setenv("TIERQ_CONFIG", str(path))
    with pytest.raises(ConfigError, match=rf"kinds\.eval\.similarity\.{field}"):
        load_settings()


def test_a_workers_registry_applies_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(kinds={"text.packs": {"max_items_per_run": 3},
                                    "text.budgeted": {"max_items_per_run": 1}})
    monkeypatch.setenv("TIERQ_HANDLERS", f"{__name__}:Packs,{__name__}:Budgeted")
    reg = WorkerResources(settings).registry()
    assert reg.packing("text.packs") == Packing(max_items=3)
    assert reg.packing("text.budgeted") is None
