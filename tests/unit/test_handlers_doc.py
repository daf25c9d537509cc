"""The examples of docs/handlers.md run as written: the handler, then its test."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "handlers.md"


def test_the_example_handler_and_its_test_run_as_documented(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert len(blocks) == 2, "docs/handlers.md: a handler example and its test"
    module = types.ModuleType("handlers_doc_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # pydantic resolves names there
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), module.__dict__)
    handler = module.WordCountHandler()
    assert handler.kind == "text.word_count"
    module.test_word_count()
