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

from tests.e2e.harness import drain, free_port, start_up, stop_up, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


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
        listed = tierq(tmp_path, {**env, "COLUMNS": "80"}, "jobs", "list", *over_http)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        rows = listed.stdout.splitlines()
        assert max(len(row) for row in rows) <= 80, listed.stdout  # fits the terminal
        assert any(job_id.group(1) in row and "succeeded" in row for row in rows), listed.stdout
        assert any(long_id.group(1) in row for row in rows), listed.stdout
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


def run_printed(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command line exactly as ``tierq up`` printed it: ``tierq`` where that name finds
    this installation, else the path of its script (the tests run it without a venv on the
    PATH, as ``make up`` does), which is run as printed."""
    import shlex

    words = shlex.split(line.split(":", 1)[1])
    script = str(Path(sys.executable).parent / "tierq")
    assert words[0] in ("tierq", script), line
    if words[0] == script:
        return subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
    return tierq(cwd, env, *words[1:])


def test_up_says_up_once_ready_and_its_next_steps_work_as_printed(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    # A handler whose setup takes a while, as loading a model does; the models extra's
    # kinds in a pool not started here, so that no model is loaded for this test.
    env["TIERQ_HANDLERS"] = "tests.handlers_for_tests:WarmHandler"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    config = tmp_path / "tierq.toml"
    config.write_text('[pools.models]\nkinds = ["document.embed", "eval.similarity"]\n')
    env["TIERQ_CONFIG"] = str(config)
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    port = free_port()
    up, banner = start_up(home, env, "--port", str(port), "--data-dir", str(tmp_path / "d"),
                          "--pools", "default")
    printed = list(banner)
    # "up" is said only once the API answers and a worker is live: at once, not eventually.
    ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code
    admin = (tmp_path / "d" / "admin.key").read_text().strip()
    live = httpx.get(f"http://127.0.0.1:{port}/v1/admin/workers", timeout=5,
                     headers={"Authorization": f"Bearer {admin}"}).json()["slots_by_pool"]
    done = drain(up, printed)
    try:
        assert ready == 200
        assert live["default"] == 2, printed
        # Meanwhile it said what it waited for: the setup of its pool's handlers that have one.
        waiting = [line for line in banner if line.startswith("waiting for")]
        assert waiting == ["waiting for the worker: loading models for warm…"], banner
        wait_until(lambda: any(line.startswith("Submit a job:") for line in printed), timeout=10)
        create = next(line for line in printed if line.startswith("Create a tenant:"))
        submit = next(line for line in printed if line.startswith("Submit a job:"))
        assert f"--data-dir {tmp_path / 'd'}" in create, create

        created = run_printed(create, elsewhere, env)  # from another directory, as printed
        assert created.returncode == 0, created.stdout + created.stderr
        assert str(tmp_path / "d" / "tierq.db") in created.stderr  # it says what it changes
        key = re.search(r"tq_[A-Za-z0-9_-]+", created.stdout)
        assert key, created.stdout
        submitted = run_printed(submit, elsewhere, {**env, "TIERQ_API_KEY": key.group(0)})
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert json.loads(submitted.stdout[submitted.stdout.index("{"):]) == {"a": 1}
        assert f"API http://127.0.0.1:{port}" in submitted.stderr
        # Without the data directory, nothing is found and nothing is created.
        lost = tierq(elsewhere, env, "tenants", "list")
        assert lost.returncode == 2 and "no tierq database found" in lost.stderr, lost.stderr
        assert len(lost.stderr.strip().splitlines()) == 1
        assert not (elsewhere / ".tierq").exists()
    finally:
        stop_up(up)  # type: ignore[arg-type]
        done()
    assert up.returncode == 0, "\n".join(printed)
    assert not (tmp_path / "d" / "up.json").exists()  # a stopped system is not found


def test_a_port_in_use_fails_at_once_in_one_line(tmp_path: Path) -> None:
    import socket

    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tierq(tmp_path, env, "up", "--port", str(port), "--data-dir",
                       str(tmp_path / "d"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"port {port} on 127.0.0.1 is not free" in result.stderr
    assert not (tmp_path / "d").exists()  # refused before anything started


def test_sighup_stops_like_sigterm_and_a_job_that_cannot_finish_goes_back_uncharged(
    tmp_path: Path,
) -> None:
    import signal

    import sqlalchemy as sa

    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    port = free_port()
    # A grace of 8 s: the hand-back comes at 5 s, with 3 s to record it and exit on a
    # loaded machine (a worker with the models extra is a heavy process to stop).
    up, printed = start_up(tmp_path, env, "--port", str(port), "--grace", "8")
    done = drain(up, printed)
    try:
        created = tierq(tmp_path, env, "tenants", "create", "acme", "--tier", "premium")
        key = re.search(r"tq_[A-Za-z0-9_-]+", created.stdout)
        assert key, created.stdout + created.stderr
        with httpx.Client(base_url=f"http://127.0.0.1:{port}",
                          headers={"Authorization": f"Bearer {key.group(0)}"}) as client:
            job = client.post("/v1/jobs", json={"kind": "sleep", "payload": {"seconds": 120}})
            assert job.status_code == 202, job.text
            job_id = job.json()["id"]
            wait_until(lambda: client.get(f"/v1/jobs/{job_id}").json()["status"] == "running")
        up.send_signal(signal.SIGHUP)
        up.wait(40)  # the grace (8 s) and the orderly stop, not the job's 120 s
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
        done()
    log = "\n".join(printed)
    assert up.returncode == 0, log
    assert "child.killed" not in log, log  # nothing needed SIGKILL: the worker stopped in time
    # Its output is a pipe, not a terminal: JSON log lines among the printed ones.
    events = [json.loads(line) for line in printed if line.startswith("{")]
    assert {"event": "child.stopped", "child": "worker", "returncode": 0}.items() <= next(
        e for e in events if e["event"] == "child.stopped" and e["child"] == "worker").items(), log
    engine = sa.create_engine(f"sqlite:///{tmp_path / '.tierq' / 'tierq.db'}")
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT status, attempt, starts, started_at FROM jobs "
                                   "WHERE id = :id"), {"id": job_id}).one()
    engine.dispose()
    # Back in the queue for the next start, the interrupted attempt not charged.
    assert (row.status, row.attempt, row.starts, row.started_at) == ("queued", 2, 0, None)
