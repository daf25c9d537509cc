"""Flower, Celery's monitor, against tierq's broker: ``run_flower(settings, port=, address=)``.

Flower shows every task with its arguments (job ids) and can control workers (revoke tasks,
shut workers down), so it listens on 127.0.0.1 unless told otherwise, and refuses to listen any
further unprotected: ``FLOWER_BASIC_AUTH=user:password`` (several pairs comma-separated), or
Flower's OAuth (``FLOWER_AUTH`` and ``FLOWER_OAUTH2_*``). Flower reads these from the
environment itself; they are no flags of ``tierq flower``, so that no password shows in ``ps``.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

from jobs.core.errors import ConfigError
from jobs.process.settings import Settings
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


def require_auth(address: str, environ: Mapping[str, str]) -> None:
    """Refuse to answer other machines unprotected; a malformed ``FLOWER_BASIC_AUTH`` is
    refused anywhere, since Flower would otherwise start with it silently ignored or broken."""
    basic = environ.get("FLOWER_BASIC_AUTH", "")
    for pair in filter(None, basic.split(",")):
        user, _, password = pair.partition(":")
        if not user or not password:
            raise ConfigError("FLOWER_BASIC_AUTH must be user:password (several pairs "
                              "comma-separated), each with a user and a password")
    if is_loopback(address) or any(environ.get(name) for name in AUTH_VARIABLES):
        return
    raise ConfigError(f"Flower would listen on {address or 'every interface'} with no "
                      f"authentication: set FLOWER_BASIC_AUTH=user:password (or Flower's "
                      f"OAuth, FLOWER_AUTH), or listen on 127.0.0.1")


def flower_argv(*, port: int, address: str) -> list[str]:
    """The ``celery flower`` arguments: the address always explicit, since Flower's own
    default ('') is every interface."""
    return ["flower", f"--port={port}", f"--address={address}"]


def run_flower(settings: Settings, *, port: int, address: str = LOCALHOST) -> None:
    require_auth(address, os.environ)
    make_celery(settings).start(flower_argv(port=port, address=address))
