"""The layering contract of pyproject.toml (import-linter): the tree keeps it, and it is not
a contract that cannot fail: the same contract over a copy of the tree's packages with one
arrow running back up (the core importing the workers) is broken."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path, config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_its_layers() -> None:
    run = lint_imports(ROOT, ROOT / "pyproject.toml")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def layered_packages(tmp_path: Path) -> list[str]:
    """Every package the contract names, empty, under ``tmp_path``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    names = {"jobs", "workers"}
    for contract in config["contracts"]:
        for layer in contract.get("layers", []):
            names.update(part.strip() for part in layer.split("|"))
    for name in names:
        folder = tmp_path.joinpath(*name.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
    return sorted(names)


def test_an_arrow_back_up_breaks_the_contract(tmp_path: Path) -> None:
    layered_packages(tmp_path)
    config = tmp_path / "pyproject.toml"
    # The layers contract alone: the copy has no third-party imports to forbid.
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("[tool.importlinter]")
    section = text[start:].split("\n[[tool.importlinter.contracts]]\nname = \"the core")[0]
    config.write_text(section.replace("include_external_packages = true\n", ""))
    assert lint_imports(tmp_path, config).returncode == 0  # empty packages keep it

    (tmp_path / "jobs" / "core" / "upward.py").write_text("import workers\n")
    run = lint_imports(tmp_path, config)
    assert run.returncode != 0
    assert "jobs.core.upward -> workers" in run.stdout


def test_the_core_imports_no_io_library() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    forbidden = next(c for c in config["contracts"] if c["name"] == "the core does no I/O")
    assert forbidden["source_modules"] == ["jobs.core"]
    assert {"sqlalchemy", "redis", "celery", "fastapi", "httpx"} <= set(
        forbidden["forbidden_modules"])
