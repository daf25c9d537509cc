"""The wheel is the product: built from this tree, installed into a fresh virtual environment,
``tierq migrate`` and ``tierq up`` work from the installed package alone.

The fresh environment gets the wheel without its dependencies (``--no-deps``); those come
from the test's own environment through a ``.pth`` line, which adds that environment's
site-packages as a plain path: its editable install of this tree is never activated, so
every ``jobs`` module imported comes from the wheel (the test checks where from).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import free_port, stop_up, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bin directory of a fresh venv with the wheel of this tree installed."""
    base = tmp_path_factory.mktemp("wheel")
    source, dist = base / "source", base / "dist"
    # Built from a copy: the build leaves nothing in this tree, and nothing stale from it.
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("jobs", "workers", "migrations", "examples"):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist),
         str(source)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("tierq-*.whl")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    purelib = Path(sysconfig.get_paths(vars={"base": str(env_dir),
                                             "platbase": str(env_dir)})["purelib"])
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "tierq_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         str(wheel)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    yield env_dir / "bin"


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TIERQ_") and k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def source_head() -> str | None:
    from jobs.store.migrate import head

    return head()


def test_the_wheel_carries_its_migrations(installed: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [str(installed / "python"), "-c",
         "import jobs, jobs.store.migrate as m; print(jobs.__file__); print(m.head())"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, check=False,
    )
    assert where.returncode == 0, where.stderr
    module, head = where.stdout.split()
    assert Path(module).is_relative_to(installed.parent), module  # not this tree
    assert head == source_head()  # every migration of this tree is in the wheel

    env = {**clean_env(), "TIERQ_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}"}
    migrated = subprocess.run([str(installed / "tierq"), "migrate"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert f"database at revision {head}" in migrated.stdout


def test_tierq_up_from_the_wheel_runs_a_job(installed: Path, tmp_path: Path) -> None:
    env, port = clean_env(), free_port()
    url = f"http://127.0.0.1:{port}"
    tierq = str(installed / "tierq")
    with (tmp_path / "up.log").open("wb") as log:
        up = subprocess.Popen([tierq, "up", "--port", str(port), "--concurrency", "1"],
                              cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, timeout=90)
        for page in ("/dashboard", "/dashboard/assets/app.js", "/dashboard/assets/style.css"):
            shipped = httpx.get(f"{url}{page}", timeout=10)  # the page's files are in the wheel
            assert shipped.status_code == 200 and shipped.content, page

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([tierq, *args], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=120, check=False)

        created = run("tenants", "create", "acme", "--tier", "premium")
        assert created.returncode == 0, created.stdout + created.stderr
        key = re.search(r"tq_[A-Za-z0-9_-]+", created.stdout)
        assert key, created.stdout
        submitted = run("submit", "echo", "--payload", '{"a": 1}', "--wait",
                        "--key", key.group(0), "--api", url)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert json.loads(submitted.stdout[submitted.stdout.index("{"):].strip()) == {"a": 1}
    finally:
        stop_up(up)
    assert up.returncode == 0, (tmp_path / "up.log").read_text()


def test_the_wheel_carries_the_simulator_scenarios(installed: Path, tmp_path: Path) -> None:
    simulated = subprocess.run(
        [str(installed / "tierq"), "simulate", "--scenario", "noisy", "--jobs", "500",
         "--policies", "tierq"],
        cwd=tmp_path, env={**clean_env(), "COLUMNS": "200"}, capture_output=True, text=True,
        timeout=120, check=False)
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    assert "noisy: 500 jobs" in simulated.stdout


def test_the_wheel_carries_the_example_run(installed: Path, tmp_path: Path) -> None:
    written = subprocess.run([str(installed / "tierq"), "examples", "ex"], cwd=tmp_path,
                             env=clean_env(), capture_output=True, text=True, timeout=60,
                             check=False)
    assert written.returncode == 0, written.stdout + written.stderr
    data = (tmp_path / "ex" / "sts-mini.jsonl").read_text().splitlines()
    assert len(data) == 6 and "batch submit ex/sts-mini.jsonl" in written.stdout
