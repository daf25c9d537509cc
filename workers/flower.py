"""Flower, Celery's monitor, against tierq's broker: ``run_flower(settings, port=, address=)``.

Flower shows every task with its arguments (job ids) and can control workers (revoke tasks,
shut workers down), so it listens on 127.0.0.1 unless told otherwise. Before it listens any
further, protect it: ``FLOWER_BASIC_AUTH=user:password`` (several pairs comma-separated), or
Flower's OAuth (``FLOWER_AUTH`` and ``FLOWER_OAUTH2_*``). Flower reads these from the
environment itself; they are no flags of ``tierq flower``, so that no password shows in ``ps``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from jobs.config import Settings
from workers.app import make_celery

LOCALHOST = "127.0.0.1"
# Flower's own variables: either one turns its authentication on.
AUTH_VARIABLES = ("FLOWER_BASIC_AUTH", "FLOWER_AUTH")


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: assume it is reachable from elsewhere
        return False


def auth_warning(address: str, environ: Mapping[str, str]) -> str | None:
    """A warning when Flower would answer other machines with no authentication configured."""
    if is_loopback(address) or any(environ.get(name) for name in AUTH_VARIABLES):
        return None
    return (f"warning: Flower listens on {address} with no authentication; set "
            f"{' or '.join(AUTH_VARIABLES)} (see `tierq flower --help`)")


def flower_argv(*, port: int, address: str) -> list[str]:
    """The ``celery flower`` arguments: the address always explicit, since Flower's own
    default ('') is every interface."""
    return ["flower", f"--port={port}", f"--address={address}"]


def run_flower(settings: Settings, *, port: int, address: str = LOCALHOST) -> None:
    make_celery(settings).start(flower_argv(port=port, address=address))
