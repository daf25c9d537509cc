"""What every ``tierq`` command shares, so each finds and names the system the same way.

Settings are read inside each command (``load_settings``), never at import. Every command finds
the system as ``jobs.process.settings`` does (flag, ``TIERQ_*``, the config file, the data
directory of ``tierq up``), refuses in one line when there is none, and names on stderr what it
acts on before it changes anything: a user's error is one red line, not a traceback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec

import typer
from rich.console import Console

from jobs.core.errors import ConfigError, InvalidRequest, TierqError
from jobs.process.settings import load_settings

if TYPE_CHECKING:
    from jobs.client.core import RetryNotice
    from jobs.client.http import Client
    from jobs.process.runtime import Runtime

P = ParamSpec("P")

ApiUrl = Annotated[
    str | None,
    typer.Option("--api", envvar="TIERQ_API_URL",
                 help="Base URL of the tierq API (default: that of the running `tierq up`).",
                 show_default=False),
]
ApiKey = Annotated[
    str | None, typer.Option("--key", envvar="TIERQ_API_KEY", help="The tenant's API key.")
]


def target(line: str) -> None:
    """Name, on stderr, the system a command is about to act on."""
    Console(stderr=True, soft_wrap=True, highlight=False).print(
        f"→ {line}", style="dim", markup=False)


def fail(message: str, code: int) -> NoReturn:
    Console(stderr=True, soft_wrap=True).print(message, style="red", markup=False, highlight=False)
    raise typer.Exit(code)


# Set by ``--debug``: an unexpected error shows its traceback instead of one line.
DEBUG = {"on": os.environ.get("TIERQ_DEBUG", "") not in ("", "0")}


def friendly(func: Callable[P, None]) -> Callable[P, None]:
    """Print every error a user can cause as one red line, no traceback: exit 2 for a bad
    configuration or input (the caller's to fix), 1 for anything else (a database or Redis
    that cannot be reached, a schema not migrated). ``--debug`` shows the traceback."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            func(*args, **kwargs)
        except (ConfigError, InvalidRequest) as exc:
            fail(exc.message, 2)
        except TierqError as exc:
            fail(exc.message, 1)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:
            if DEBUG["on"]:
                raise
            fail(f"{one_line(exc)} (run with --debug for the traceback)", 1)

    return wrapper


def one_line(exc: BaseException) -> str:
    """What went wrong, in the user's terms where the cause is known."""
    import redis
    import sqlalchemy.exc

    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        if "no such table" in first or ("does not exist" in first and "relation" in first):
            return f"the database has no tierq schema: run `tierq migrate` first ({first})"
        if isinstance(exc, sqlalchemy.exc.OperationalError):
            return f"the database cannot be reached: {first}"
        return f"the database refused: {first}"
    if isinstance(exc, redis.RedisError):
        return f"Redis cannot be reached: {first}"
    return f"{type(exc).__name__}: {first}"


def open_runtime(*, announce: bool) -> Runtime:
    """The system's connections; ``announce``: say on stderr which system is changed."""
    from jobs.process.runtime import Runtime

    settings = load_settings()
    if announce:
        target(settings.describe_target())
    return Runtime.from_settings(settings)


def api_client(api_url: str | None, key: str | None, *, announce: bool = False) -> Client:
    """A client for the API found as every command finds the system (``--api``,
    ``TIERQ_API_URL``, the config file, the running ``tierq up``)."""
    from jobs.client.http import Client

    overrides: dict[str, Any] = {"api_url": api_url} if api_url else {}
    url = load_settings(**overrides).resolved_api_url()
    if not key:
        fail("no API key: pass --key or set TIERQ_API_KEY (tierq tenants create prints one)", 2)
    if announce:
        target(f"API {url}")
    return Client(url, key, on_retry=say_retry)


def say_retry(notice: RetryNotice) -> None:
    """A refusal (or an outage) the client waits out, said as it happens: a command never
    sits silent while it retries."""
    error = notice.error
    what = getattr(error, "type", None)
    why = f"{what}: {getattr(error, 'message', error)}" if what else str(error)
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"{why.rstrip('.')}; trying again in {notice.delay_s:.1f} s "
        f"(try {notice.attempt} of {notice.attempts})", style="yellow", markup=False)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        Console(highlight=False).print(f"tierq {version('tierq')}")
        raise typer.Exit()


def global_options(
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", show_default=False,
                     help="The data directory of `tierq up` to act on [env TIERQ_DATA_DIR; "
                          "default ./.tierq]."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", show_default=False,
                     help="A TOML configuration file [env TIERQ_CONFIG]."),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of an unexpected error.")
    ] = False,
    _version_: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True,
                     help="Print the version and exit."),
    ] = None,
) -> None:
    """tierq: a durable, tiered job scheduler for expensive (GPU) work."""
    if debug:
        DEBUG["on"] = True
    # Flags win over the environment; set there, they reach every process a command starts.
    if data_dir is not None:
        os.environ["TIERQ_DATA_DIR"] = str(data_dir.resolve())
    if config is not None:
        os.environ["TIERQ_CONFIG"] = str(config.resolve())
