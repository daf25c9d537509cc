"""The wheel's package list is explicit (the top-level migrations/ is mapped in as
jobs.migrations, which packages.find cannot do): every package of the tree is in it, and
jobs/ holds packages only."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def listed() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(config["packages"])


def test_every_package_of_the_tree_is_listed_for_the_wheel() -> None:
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("jobs", "workers")
        for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    found.update({"jobs.migrations", "jobs.examples"})  # the mapped folders (package-dir)
    assert found - listed() == set(), "add these to [tool.setuptools] packages"
    assert listed() - found == set(), "these are listed but not in the tree"


def test_the_migrations_folder_is_mapped_into_the_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"]["jobs.migrations"] == "migrations"
    assert (ROOT / "migrations" / "env.py").is_file()


def test_jobs_holds_packages_and_no_module_of_its_own() -> None:
    modules = sorted(p.name for p in (ROOT / "jobs").glob("*.py") if p.name != "__init__.py")
    assert modules == []
