"""Keys are looked up in a brief per-process cache, and admin changes reach every process.

Two API apps, each with its own runtime, listener and cache, on one PostgreSQL database and
one Redis key prefix: what the admin changes through one is honoured by the other as soon as
its announcement arrives.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from jobs.service.tenant_cache import TTL_S, TenantCache
from tests.integration.api_harness import ADMIN_KEY, ApiClient, auth, rt, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
def second(client: ApiClient) -> Iterator[ApiClient]:
    """Another API process on the same database and Redis."""
    with running_api(rt(client).settings) as api:
        yield api


def cache_of(client: ApiClient) -> TenantCache:
    cache: TenantCache = client.app.state.tenant_cache
    return cache


def cached(client: ApiClient, key: str) -> None:
    """Use ``key`` until this process keeps its tenant (once its listener is subscribed)."""
    deadline = time.monotonic() + 20
    while True:
        assert client.get("/v1/jobs", headers=auth(key)).status_code == 200
        if len(cache_of(client)) > 0:
            return
        assert time.monotonic() < deadline, "the tenant was never cached"
        time.sleep(0.01)


def heard(client: ApiClient) -> None:
    """Wait until this process has heard the announcement and dropped the tenant it kept:
    milliseconds, but another process's listener thread may not have run yet when the
    admin call returns. Sooner than half the TTL, so it was the announcement, not expiry."""
    deadline = time.monotonic() + TTL_S / 2
    while len(cache_of(client)) > 0:
        assert time.monotonic() < deadline, "the change was never announced to this process"
        time.sleep(0.01)


class KeyLookups:
    """SQL statements that look a tenant up by its key's hash."""

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        self._engine = engine
        sa.event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "api_key_hash =" in statement:
            self.count += 1

    def close(self) -> None:
        sa.event.remove(self._engine, "before_cursor_execute", self._seen)


def test_a_known_key_costs_sql_once(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    lookups = KeyLookups(rt(client).engine)
    try:
        cached(client, key)
        before = lookups.count
        for _ in range(20):
            assert client.get("/v1/jobs", headers=auth(key)).status_code == 200
        assert lookups.count == before
    finally:
        lookups.close()


def test_a_rotated_key_is_refused_by_every_process_at_once(
    client: ApiClient, second: ApiClient
) -> None:
    tenant = client.create_tenant("acme")
    old = tenant["api_key"]
    cached(second, old)
    cached(client, old)
    rotated = client.post(f"/v1/admin/tenants/{tenant['id']}/rotate-key",
                          headers=auth(ADMIN_KEY))
    assert rotated.status_code == 200
    heard(second)
    assert second.get("/v1/jobs", headers=auth(old)).status_code == 401
    assert client.get("/v1/jobs", headers=auth(old)).status_code == 401
    new = rotated.json()["api_key"]
    assert second.get("/v1/jobs", headers=auth(new)).status_code == 200


def test_a_cached_tenant_sees_its_new_tier(client: ApiClient, second: ApiClient) -> None:
    tenant = client.create_tenant("acme", "free")
    key = tenant["api_key"]
    cached(second, key)
    patched = client.patch(f"/v1/admin/tenants/{tenant['id']}", json={"tier": "standard"},
                           headers=auth(ADMIN_KEY))
    assert patched.status_code == 200
    heard(second)
    submitted = second.submit(key)
    assert submitted.status_code == 202, submitted.text
    assert submitted.json()["tier"] == "standard"


def test_unknown_keys_do_not_grow_the_cache(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    cached(client, key)
    for _ in range(300):
        bad = "tq_" + secrets.token_urlsafe(32)
        assert client.get("/v1/jobs", headers=auth(bad)).status_code == 401
    assert len(cache_of(client)) == 1
    assert client.get("/v1/jobs", headers=auth(key)).status_code == 200
