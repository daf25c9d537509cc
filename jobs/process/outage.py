"""What counts as an outage of a backend (Redis or SQL), as opposed to a bug: an outage is
answered ``503`` with ``Retry-After`` and logged as one line, never as a traceback."""

from __future__ import annotations

import redis
import sqlalchemy.exc as sa_exc

REDIS_OUTAGE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


SQL_OUTAGE: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,
)


def is_backend_outage(exc: BaseException) -> bool:
    """True for errors that mean SQL or Redis cannot be reached right now (a 503)."""
    if isinstance(exc, SQL_OUTAGE + REDIS_OUTAGE):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and bool(exc.connection_invalidated)
