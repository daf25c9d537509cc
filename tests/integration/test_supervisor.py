"""The `tierq up` supervisor with real child processes, and the embedded Redis it runs."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from jobs.local.embedded_redis import EmbeddedRedis
from jobs.local.supervisor import Backoff, ChildSpec, Supervisor
from jobs.local.up import admin_key

pytestmark = pytest.mark.integration

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def stubborn(ready: Path) -> list[str]:
    """A child that ignores SIGTERM, and says so in ``ready`` once it does."""
    code = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "pathlib.Path(sys.argv[1]).write_text('ready')\n"
        "time.sleep(60)\n"
    )
    return [sys.executable, "-c", code, str(ready)]


def eventually(check: Callable[[], bool], *, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    sup = Supervisor(grace_s=5.0)
    yield sup
    sup.stop(grace_s=1.0)


def test_a_killed_child_is_restarted_after_its_backoff(supervisor: Supervisor) -> None:
    supervisor.add(ChildSpec(name="a", argv=SLEEPER))
    supervisor.add(ChildSpec(name="b", argv=SLEEPER))
    first = supervisor.pids()
    os.kill(first["a"], signal.SIGKILL)

    exits: list[str] = []
    eventually(lambda: exits.extend(supervisor.run_once().exited) or bool(exits))
    assert exits == ["a"]
    assert "a" not in supervisor.pids()

    later = supervisor.clock() + supervisor.backoff.initial_s
    stats = supervisor.run_once(now=later)
    assert stats.started == ("a",)
    assert supervisor.alive("a") and supervisor.alive("b")
    assert supervisor.pids()["a"] != first["a"]
    assert supervisor.pids()["b"] == first["b"]


def test_restart_is_not_due_before_the_backoff(supervisor: Supervisor) -> None:
    supervisor.add(ChildSpec(name="a", argv=[sys.executable, "-c", "pass"]))
    exits: list[str] = []
    eventually(lambda: exits.extend(supervisor.run_once().exited) or bool(exits))
    assert supervisor.run_once(now=supervisor.clock()).started == ()
    assert not supervisor.alive("a")


def test_backoff_doubles_to_its_cap_and_resets_after_good_running() -> None:
    backoff = Backoff()
    assert [backoff.delay_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]

    now = [1000.0]
    sup = Supervisor(clock=lambda: now[0])
    try:
        sup.add(ChildSpec(name="a", argv=[sys.executable, "-c", "pass"]))
        for expected_delay in (1, 2, 4):
            eventually(lambda: bool(sup.run_once().exited))
            assert sup.run_once(now=now[0] + expected_delay - 0.01).started == ()
            now[0] += expected_delay
            assert sup.run_once().started == ("a",)
        now[0] += 61  # the last start ran "long enough" before its death
        eventually(lambda: bool(sup.run_once().exited))
        now[0] += 1
        assert sup.run_once().started == ("a",)
    finally:
        sup.stop(grace_s=1.0)


def test_stop_terminates_every_child_and_leaves_no_process() -> None:
    sup = Supervisor(grace_s=5.0)
    for name in ("api", "dispatcher", "worker"):
        sup.add(ChildSpec(name=name, argv=SLEEPER))
    pids = list(sup.pids().values())
    assert len(pids) == 3
    sup.stop()
    eventually(lambda: all(gone(pid) for pid in pids))
    assert sup.pids() == {}
    assert sup.run_once().started == ()  # nothing comes back after a stop


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    sup = Supervisor(grace_s=0.5)
    sup.add(ChildSpec(name="stubborn", argv=stubborn(ready)))
    sup.add(ChildSpec(name="polite", argv=SLEEPER))
    pids = list(sup.pids().values())
    eventually(ready.exists)
    codes = sup.stop()
    assert codes == {"stubborn": -signal.SIGKILL, "polite": -signal.SIGTERM}
    eventually(lambda: all(gone(pid) for pid in pids))


def test_the_last_phase_stops_after_the_others_are_gone(tmp_path: Path) -> None:
    """The embedded Redis (a later phase) is asked to stop only once the rest has exited."""
    worker_pid, seen, ready = tmp_path / "worker.pid", tmp_path / "seen", tmp_path / "ready"
    last = (
        "import os, pathlib, signal, sys, time\n"
        "def on_term(*_):\n"
        "    pid = int(pathlib.Path(sys.argv[1]).read_text())\n"
        "    try:\n"
        "        os.kill(pid, 0)\n"
        "        pathlib.Path(sys.argv[2]).write_text('worker alive')\n"
        "    except ProcessLookupError:\n"
        "        pathlib.Path(sys.argv[2]).write_text('worker gone')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "pathlib.Path(sys.argv[3]).write_text('ready')\n"
        "time.sleep(60)\n"
    )
    sup = Supervisor(grace_s=5.0)
    sup.add(ChildSpec(
        name="redis",
        argv=[sys.executable, "-c", last, str(worker_pid), str(seen), str(ready)],
        stop_phase=1,
    ))
    sup.add(ChildSpec(name="worker", argv=SLEEPER))
    worker_pid.write_text(str(sup.pids()["worker"]))
    eventually(ready.exists)
    codes = sup.stop()
    assert codes == {"worker": -signal.SIGTERM, "redis": 0}
    assert seen.read_text() == "worker gone"


def test_the_embedded_redis_starts_answers_and_stops(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    embedded = EmbeddedRedis(data_dir=data_dir)
    sup = Supervisor(grace_s=5.0)
    try:
        sup.add(ChildSpec(name="redis", argv=embedded.prepare(), stop_phase=1))
        embedded.wait_ready(alive=lambda: sup.alive("redis"))
        client = redis.Redis.from_url(embedded.url)
        assert client.ping()
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert client.config_get("port") == {"port": "0"}  # no TCP port at all
        client.close()
        assert oct(embedded.socket_path.stat().st_mode & 0o777) == oct(0o700)
        pid = sup.pids()["redis"]
    finally:
        sup.stop()
    eventually(lambda: gone(pid))
    assert not embedded.ping()
    assert (data_dir / "appendonly.aof").exists()


def test_a_second_embedded_redis_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    from jobs.core.errors import ConfigError

    embedded = EmbeddedRedis(data_dir=tmp_path)
    sup = Supervisor(grace_s=5.0)
    try:
        sup.add(ChildSpec(name="redis", argv=embedded.prepare()))
        embedded.wait_ready(alive=lambda: sup.alive("redis"))
        with pytest.raises(ConfigError, match="already answers"):
            EmbeddedRedis(data_dir=tmp_path).prepare()
    finally:
        sup.stop()


def test_the_admin_key_is_made_once_private_and_reused(tmp_path: Path) -> None:
    key = admin_key(None, tmp_path)
    assert len(key) >= 32
    assert (tmp_path / "admin.key").stat().st_mode & 0o777 == 0o600
    assert admin_key(None, tmp_path) == key
    assert admin_key("configured", tmp_path) == "configured"


def dead(pid: int) -> bool:
    """Gone, or a zombie waiting for whoever adopted it to reap it."""
    if gone(pid):
        return True
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    return fields[0] == "Z"


def test_children_die_with_a_supervisor_that_is_killed(tmp_path: Path) -> None:
    import subprocess

    script = (
        "import sys, time\n"
        "from jobs.local.supervisor import ChildSpec, Supervisor\n"
        "sup = Supervisor()\n"
        "sup.add(ChildSpec(name='a', argv=[sys.executable, '-c', 'import time; time.sleep(60)']))\n"
        "print(sup.pids()['a'], flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not dead(child)
        parent.kill()
        parent.wait()
        eventually(lambda: dead(child))
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_up_waits_for_the_setup_of_its_pools_kinds_and_names_them() -> None:
    """What ``tierq up`` says while its workers start: the kinds of the pools it started whose
    handler sets up before its worker registers (none when they set up lazily)."""
    from jobs.local.up import setup_kinds, waiting_line
    from jobs.process.settings import load_settings

    env = {"TIERQ_HANDLERS": "tests.handlers_for_tests:WarmHandler"}
    settings = load_settings(pools={"gpu": {"kinds": ["warm"]}})
    assert setup_kinds(settings, ["gpu"], env) == ["warm"]
    assert "warm" not in setup_kinds(settings, ["default"], env)  # another pool's kind
    lazy = settings.model_copy(update={"worker_setup": "lazy"})
    assert setup_kinds(lazy, ["gpu"], env) == []
    assert waiting_line(["a.b", "warm"], ["default"]) == (
        "waiting for the worker: loading models for a.b, warm…")
    assert waiting_line([], ["default", "gpu"]) == (
        "waiting for the workers of default, gpu to start…")
