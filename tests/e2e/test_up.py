"""`tierq up` on a fresh directory: SQLite + embedded Redis, driven through the CLI and HTTP."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import free_port, stop_up, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def session_members(sid: int) -> list[int]:
    """Pids of live processes in session ``sid`` (all of ``tierq up``'s children)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def tierq(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_up_runs_everything_and_stops_cleanly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    port = free_port()
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "up", "--port", str(port), "--concurrency", "2"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, timeout=90)
        assert (tmp_path / ".tierq" / "tierq.db").exists()
        assert (tmp_path / ".tierq" / "redis.sock").exists()

        created = tierq(tmp_path, env, "tenants", "create", "acme", "--tier", "premium")
        assert created.returncode == 0, created.stderr
        key = re.search(r"tq_[A-Za-z0-9_-]+", created.stdout)
        assert key, created.stdout

        submitted = tierq(
            tmp_path,
            env,
            "submit",
            "echo",
            "--payload",
            '{"a": 1}',
            "--wait",
            "--key",
            key.group(0),
            "--api",
            url,
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert json.loads(submitted.stdout[submitted.stdout.index("{") :].strip()) == {"a": 1}
        job_id = re.search(r"job (\S+)", submitted.stdout)
        assert job_id, submitted.stdout
        over_http = ("--key", key.group(0), "--api", url)

        got = tierq(tmp_path, env, "jobs", "get", job_id.group(1), *over_http)
        assert got.returncode == 0, got.stdout + got.stderr
        assert json.loads(got.stdout)["status"] == "succeeded"
        result = tierq(tmp_path, env, "jobs", "result", job_id.group(1), *over_http)
        assert result.returncode == 0, result.stdout + result.stderr
        assert json.loads(result.stdout) == {"a": 1}
        long = tierq(tmp_path, env, "submit", "sleep", "--payload", '{"seconds": 60}', *over_http)
        long_id = re.search(r"job (\S+)", long.stdout)
        assert long.returncode == 0 and long_id, long.stdout + long.stderr
        cancelled = tierq(tmp_path, env, "jobs", "cancel", long_id.group(1), *over_http)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert "cancelled" in cancelled.stdout or "asked to stop" in cancelled.stdout
        unknown = tierq(tmp_path, env, "jobs", "get", "not-a-job", *over_http)
        assert unknown.returncode == 1 and "Traceback" not in unknown.stderr

        updated = tierq(tmp_path, env, "tenants", "update", "acme", "--cap", "2")
        assert updated.returncode == 0 and "cap=2" in updated.stdout, updated.stdout
        cleared = tierq(tmp_path, env, "tenants", "update", "acme", "--clear", "cap")
        assert cleared.returncode == 0 and "overrides: none" in cleared.stdout, cleared.stdout
        rotated = tierq(tmp_path, env, "tenants", "rotate-key", "acme")
        new_key = re.search(r"tq_[A-Za-z0-9_-]+", rotated.stdout)
        assert rotated.returncode == 0 and new_key, rotated.stdout + rotated.stderr
        old = tierq(tmp_path, env, "jobs", "get", job_id.group(1), *over_http)
        assert old.returncode == 1, old.stdout  # the old key stopped working
        fresh = tierq(tmp_path, env, "jobs", "get", job_id.group(1), "--key", new_key.group(0),
                      "--api", url)
        assert fresh.returncode == 0, fresh.stdout + fresh.stderr

        children = session_members(up.pid)
        assert len(children) >= 4  # up, embedded redis, api, dispatcher, worker
    finally:
        try:
            stop_up(up)
        finally:
            log.close()
    wait_until(lambda: session_members(up.pid) == [], timeout=15)
    assert up.returncode == 0, (tmp_path / "up.log").read_text()
