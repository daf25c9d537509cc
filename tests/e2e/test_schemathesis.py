"""Schemathesis against a live API process: every operation, with a tenant's key and with the
admin key, answers without a 5xx and as its OpenAPI document says (a documented status, a
body of the documented schema, the documented headers and content type).

The API runs as a real ``tierq api`` process on SQLite (whose integers overflow where
PostgreSQL's raise, so a missing bound shows as a 500 here) and Redis. Each operation gets
requests that fit its schema and requests that do not (which must be refused with a 4xx),
and, where a path names a job or a tenant, requests naming real ones, so the deeper paths
run too. Generation is derandomized and bounded per operation, so the test takes seconds and
a failure it reports comes back on the next run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import CheckFunction

from tests.e2e.harness import ADMIN_KEY
from tests.e2e.live_api import live_api
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MAX_EXAMPLES = 50
CONFIG = "[policy]\npool_concurrency = 4\nmean_service_s = 1.0\n"
# Requests that fit the schema and requests that do not, by turns.
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)


@dataclass(frozen=True)
class Deployment:
    url: str
    tenant_key: str
    job_id: str  # a job of the tenant whose key is used
    tenant_id: str  # a tenant the admin may change and re-key (not the one above)


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Deployment]:
    with live_api(tmp_path_factory.mktemp("schemathesis"), redis_server, CONFIG) as system:
        with system.admin() as admin:
            acme = admin.post("/v1/admin/tenants", json={"name": "acme", "tier": "free"})
            target = admin.post("/v1/admin/tenants", json={"name": "target", "tier": "free"})
        assert acme.status_code == target.status_code == 201, (acme.text, target.text)
        key = acme.json()["api_key"]
        job = httpx.post(f"{system.url}/v1/jobs", json={"kind": "echo"}, headers=_auth(key),
                         timeout=10)
        assert job.status_code == 202, job.text
        yield Deployment(url=system.url, tenant_key=key, job_id=job.json()["id"],
                         tenant_id=target.json()["id"])


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _checks() -> list[CheckFunction]:
    from schemathesis import checks

    return [
        checks.not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_headers_conformance,
        checks.response_schema_conformance,
        checks.negative_data_rejection,
    ]


def _cases(
    operation: APIOperation, deployment: Deployment, key: str
) -> st.SearchStrategy[Case]:
    """Generated requests with ``key``, half of them naming the deployment's real job or
    tenant. The key is fixed, so a request that does not fit the schema is never merely one
    without a key."""
    headers = _auth(key)
    strategies = [operation.as_strategy(mode, headers=headers) for mode in MODES]
    real: dict[str, Any] = {}
    if "{job_id}" in operation.path:
        real = {"job_id": deployment.job_id}
    elif "{tenant_id}" in operation.path:
        real = {"tenant_id": deployment.tenant_id}
    if real:
        # A long-poll of a job that will not change would only wait out its time.
        query = {"wait": 0} if operation.path == "/v1/jobs/{job_id}" else None
        strategies += [operation.as_strategy(mode, path_parameters=real, query=query,
                                             headers=headers) for mode in MODES]
    return st.one_of(strategies)


def _exercise(deployment: Deployment, key: str) -> list[str]:
    """Run every operation's cases with ``key``; the failures, one line per operation."""
    schema = schemathesis.openapi.from_url(f"{deployment.url}/openapi.json")
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 13
    for operation in operations:

        @settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate],  # no shrinking: bounded time
                  suppress_health_check=list(HealthCheck))
        @given(case=_cases(operation, deployment, key))
        def run(case: Case) -> None:
            case.call_and_validate(checks=_checks())

        try:
            run()
        except Exception as exc:  # each failing operation is reported, not only the first
            failures.append(f"{operation.label}: {exc}")
    return failures


def test_every_operation_with_a_tenant_key(deployment: Deployment) -> None:
    failures = _exercise(deployment, deployment.tenant_key)
    assert not failures, "\n\n".join(failures)


def test_every_operation_with_the_admin_key(deployment: Deployment) -> None:
    failures = _exercise(deployment, ADMIN_KEY)
    assert not failures, "\n\n".join(failures)
