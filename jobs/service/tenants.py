"""The tenant service: accounts, their tiers and their API keys.

Used by the admin routes of the API and by ``tierq tenants``. A key is shown once, when it is
made; only its sha256 is stored, so a leaked database does not leak working keys. A tier is
checked against the policy here, so neither caller can file a tenant under a tier that this
deployment does not serve.

A change to a tenant that a cached copy could hide (its key, tier or limits) clears the
caller's ``TenantCache`` at once and tells the other processes (``jobs.index.notify``) right
after the commit.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import re
import secrets
import uuid

from jobs.core.domain import Tenant
from jobs.core.errors import InvalidRequest, NotFound
from jobs.core.policy import Policy
from jobs.index import notify
from jobs.process.runtime import Runtime
from jobs.service.tenant_cache import TenantCache
from jobs.store import tenants as tenants_sql

logger = logging.getLogger(__name__)

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,100}$"
_NAME = re.compile(NAME_PATTERN)
KEY_PREFIX = "tq_"


def new_api_key() -> str:
    """A fresh key: 256 random bits, URL-safe, with a prefix that secret scanners can spot."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The stored form of a key (sha256 hex): random keys need no salt or slow hash."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidRequest(
            "a tenant name is 1 to 100 characters of letters, digits, '.', '_' and '-'",
            details=[{"loc": ["body", "name"], "msg": "invalid tenant name"}],
        )
    return name


def check_tier(policy: Policy, tier: str) -> str:
    if tier not in policy.tiers:
        known = ", ".join(sorted(policy.tiers))
        raise InvalidRequest(
            f"unknown tier {tier!r}; this deployment has: {known}",
            details=[{"loc": ["body", "tier"], "msg": "unknown tier"}],
        )
    return tier


def parse_tenant_id(tenant_id: str) -> str:
    """The canonical form of a tenant id; anything that is not a UUID names no tenant."""
    try:
        return str(uuid.UUID(tenant_id))
    except ValueError:
        raise NotFound("no such tenant", tenant_id=tenant_id) from None


def create_tenant(runtime: Runtime, *, name: str, tier: str) -> tuple[Tenant, str]:
    """Create a tenant and return it with its API key (the only time the key is seen)."""
    check_name(name)
    check_tier(runtime.policy, tier)
    key = new_api_key()
    with runtime.sessions.begin() as session:
        tenant = tenants_sql.create_tenant(
            session, name=name, tier=tier, api_key_hash=hash_key(key), now=runtime.clock()
        )
    logger.info("tenant.created", extra={"event": "tenant.created", "tenant": tenant.id,
                                         "tier": tier})
    return tenant, key


def rotate_key(
    runtime: Runtime, tenant_id: str, *, cache: TenantCache | None = None
) -> tuple[Tenant, str]:
    """Give the tenant a new key; the old one stops working at once."""
    key = new_api_key()
    with runtime.sessions.begin() as session:
        tenant = tenants_sql.update_tenant(
            session, parse_tenant_id(tenant_id), api_key_hash=hash_key(key)
        )
    if tenant is None:
        raise NotFound("no such tenant", tenant_id=tenant_id)
    _changed(runtime, tenant, cache)
    logger.info("tenant.key_rotated", extra={"event": "tenant.key_rotated", "tenant": tenant.id})
    return tenant, key


def list_tenants(runtime: Runtime) -> list[Tenant]:
    with runtime.sessions() as session:
        return tenants_sql.list_tenants(session)


def get_tenant(runtime: Runtime, tenant_id: str) -> Tenant:
    with runtime.sessions() as session:
        tenant = tenants_sql.get_tenant(session, parse_tenant_id(tenant_id))
    if tenant is None:
        raise NotFound("no such tenant", tenant_id=tenant_id)
    return tenant


class _Unchanged(enum.Enum):
    UNCHANGED = "unchanged"


UNCHANGED = _Unchanged.UNCHANGED
# The per-tenant overrides of the tier's policy, and the least value each may take.
OVERRIDES: dict[str, float] = {"cap": 1, "max_queued": 1, "rate_per_s": 1e-6, "rate_burst": 1}


def update_tenant(
    runtime: Runtime,
    tenant_id: str,
    *,
    tier: str | None = None,
    cap: int | _Unchanged | None = UNCHANGED,
    max_queued: int | _Unchanged | None = UNCHANGED,
    rate_per_s: float | _Unchanged | None = UNCHANGED,
    rate_burst: int | _Unchanged | None = UNCHANGED,
    cache: TenantCache | None = None,
) -> Tenant:
    """Change a tenant's tier (None: unchanged) or its overrides of the tier's policy:
    ``cap`` (running at once), ``max_queued`` (queued quota), ``rate_per_s``/``rate_burst``
    (its token bucket); ``None`` clears an override, so the tier's value applies again.
    Jobs already submitted keep the tier they were submitted under."""
    fields: dict[str, str | int | float | None] = {}
    if tier is not None:
        fields["tier"] = check_tier(runtime.policy, tier)
    given = {"cap": cap, "max_queued": max_queued, "rate_per_s": rate_per_s,
             "rate_burst": rate_burst}
    for name, value in given.items():
        if value is UNCHANGED:
            continue
        if value is not None and not value >= OVERRIDES[name]:
            raise InvalidRequest(
                f"{name} must be at least {OVERRIDES[name]:g}, or null to use the tier's",
                details=[{"loc": ["body", name], "msg": "out of range"}],
            )
        fields[name] = value
    with runtime.sessions.begin() as session:
        tenant = tenants_sql.update_tenant(session, parse_tenant_id(tenant_id), **fields)
    if tenant is None:
        raise NotFound("no such tenant", tenant_id=tenant_id)
    _changed(runtime, tenant, cache)
    logger.info("tenant.updated", extra={"event": "tenant.updated", "tenant": tenant.id,
                                         "tier": tenant.tier, "fields": sorted(fields)})
    return tenant


def _changed(runtime: Runtime, tenant: Tenant, cache: TenantCache | None) -> None:
    """After the commit: forget cached copies here, then tell the other processes."""
    if cache is not None:
        cache.invalidate()
    notify.announce_tenants(runtime.redis, runtime.settings.key_prefix, [tenant.id])


def tenant_for_key(
    runtime: Runtime, key: str, cache: TenantCache | None = None
) -> Tenant | None:
    """The tenant holding this key, or None; from ``cache`` when it holds a fresh copy."""
    key_hash = hash_key(key)
    if cache is None:
        with runtime.sessions() as session:
            return tenants_sql.tenant_by_key_hash(session, key_hash)
    cached = cache.get(key_hash)
    if cached is not None:
        return cached
    generation = cache.generation
    with runtime.sessions() as session:
        tenant = tenants_sql.tenant_by_key_hash(session, key_hash)
    if tenant is not None:
        cache.put(key_hash, tenant, generation)
    return tenant
