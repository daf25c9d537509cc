"""The SQL of tenants: create, look up (by id, name or key hash), list, update.

A taken name is a unique violation caught inside a SAVEPOINT (on PostgreSQL a failed
statement would otherwise abort the whole transaction), translated to ``InvalidRequest``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.core.domain import Tenant
from jobs.core.errors import InvalidRequest
from jobs.store.models import (
    TenantRow,
)
from jobs.store.rows import (
    FRESH,
    dt,
    rowcount,
    tenant_from_row,
)

TENANT_FIELDS = frozenset({"tier", "api_key_hash", "cap", "max_queued", "rate_per_s", "rate_burst"})


def create_tenant(
    session: Session, *, name: str, tier: str, api_key_hash: str, now: float
) -> Tenant:
    row = TenantRow(
        id=str(uuid.uuid4()), name=name, tier=tier, api_key_hash=api_key_hash, created_at=dt(now)
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        if tenant_by_name(session, name) is None:
            raise
        raise InvalidRequest(f"a tenant named {name!r} already exists", name=name) from None
    return tenant_from_row(row)


def get_tenant(session: Session, tenant_id: str) -> Tenant | None:
    return _tenant_where(session, TenantRow.id == tenant_id)


def tenant_by_name(session: Session, name: str) -> Tenant | None:
    return _tenant_where(session, TenantRow.name == name)


def tenant_by_key_hash(session: Session, key_hash: str) -> Tenant | None:
    return _tenant_where(session, TenantRow.api_key_hash == key_hash)


def _tenant_where(session: Session, criterion: sa.ColumnElement[bool]) -> Tenant | None:
    stmt = sa.select(TenantRow).where(criterion).limit(1)
    row = session.scalars(stmt, execution_options=FRESH).first()
    return None if row is None else tenant_from_row(row)


def list_tenants(session: Session) -> list[Tenant]:
    rows = session.scalars(sa.select(TenantRow).order_by(TenantRow.name), execution_options=FRESH)
    return [tenant_from_row(row) for row in rows]


def cap_overrides(session: Session) -> dict[str, int]:
    """The tenants' own caps, by id: the dispatcher reads them at every upkeep, so only the
    two columns of the tenants that have one."""
    rows = session.execute(
        sa.select(TenantRow.id, TenantRow.cap).where(TenantRow.cap.is_not(None))
    )
    return {tenant_id: cap for tenant_id, cap in rows if cap is not None}


def tenants_by_ids(session: Session, tenant_ids: Iterable[str]) -> dict[str, Tenant]:
    """The tenants of these ids that exist, by id (one query, by primary key)."""
    ids = sorted(set(tenant_ids))
    if not ids:
        return {}
    stmt = sa.select(TenantRow).where(TenantRow.id.in_(ids))
    return {row.id: tenant_from_row(row)
            for row in session.scalars(stmt, execution_options=FRESH)}


def update_tenant(
    session: Session, tenant_id: str, **fields: str | int | float | None
) -> Tenant | None:
    """Change the tier, the key hash or the overrides; None when there is no such tenant."""
    unknown = set(fields) - TENANT_FIELDS
    if unknown:
        raise TypeError(f"update_tenant() got unexpected fields {sorted(unknown)}")
    if fields:
        stmt = sa.update(TenantRow).where(TenantRow.id == tenant_id).values(**fields)
        if rowcount(session, stmt) != 1:
            return None
    return get_tenant(session, tenant_id)
