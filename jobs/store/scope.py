"""One pool's rows: the ``WHERE`` a ``KindScope`` (``jobs.core.pools``) adds to a read.

The empty scope (a deployment of one pool) adds nothing, so such a deployment's reads are
the statements they always were.
"""

from __future__ import annotations

from typing import Any, TypeVar

import sqlalchemy as sa

from jobs.core.pools import KindScope

S = TypeVar("S", bound=Any)
# Every kind: the reads of a deployment of one pool.
EVERY_KIND = KindScope()


def scoped(stmt: S, kind: Any, scope: KindScope) -> S:
    """``stmt`` restricted to the rows whose ``kind`` column the scope covers."""
    if scope.include is not None:
        stmt = stmt.where(kind.in_(sorted(scope.include)) if scope.include else sa.false())
    if scope.exclude:
        stmt = stmt.where(kind.not_in(sorted(scope.exclude)))
    return stmt
