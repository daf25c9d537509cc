"""The packing example of docs/handlers.md runs as written: the handler packs by its own
declaration and the configuration's, and its test passes."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from jobs.process.settings import KindSettings
from workers.handlers import JobContext, Packing, check_run, default_registry

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "handlers.md"


def test_the_packing_example_runs_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```py\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert len(blocks) == 1, "docs/handlers.md: one packing example, with its test"
    module = types.ModuleType("handlers_doc_packing_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # pydantic resolves names there
    exec(compile(blocks[0], str(DOC), "exec"), module.__dict__)
    module.test_text_words_packed()

    handler = module.TextWordsHandler()
    registry = default_registry("", entry_points=False)
    registry.register(handler)
    packing = registry.packing(handler.kind)
    assert packing is not None
    assert (packing.max_items, packing.max_cost) == (32, 200_000)
    assert packing.cost_of({"texts": ["abc", "de"]}) == 5
    registry.configure_packing({handler.kind: KindSettings(max_items_per_run=1)})
    assert registry.packing(handler.kind) is None
    registry.configure_packing({handler.kind: KindSettings(max_items_per_run=4)})
    assert registry.packing(handler.kind) == Packing(max_items=4, max_cost=200_000,
                                                     cost=handler.cost)

    # Over several batches: a cancelled item is skipped, the others run on.
    payloads = [handler.validate({"texts": ["one two"] * 100}) for _ in range(3)]
    run = [JobContext(job_id=f"j{i}", attempt=1, tenant_id="t", kind=handler.kind)
           for i in range(3)]
    run[1].mark_cancelled()
    first, second, third = handler.run_many(run, payloads)
    assert first == third == {"words": [2] * 100}
    assert isinstance(second, module.JobCancelled)
    assert run[1].last_report is None and check_run(run) == [0, 2]
