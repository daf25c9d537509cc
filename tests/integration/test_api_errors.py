"""Hostile and broken requests: each gets its documented status and a typed error body,
never a 500 or a traceback. Also: the API with Redis or the database unreachable."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jobs.api.app import create_app
from jobs.core.domain import NewJob
from jobs.process.runtime import Runtime
from jobs.process.settings import Settings, load_settings
from jobs.service.tenants import create_tenant
from jobs.store import jobs as jobs_sql
from tests.integration.api_harness import ADMIN_KEY, ApiClient, api_client, auth
from tests.services import RedisServer

pytestmark = pytest.mark.integration

JSON = {"content-type": "application/json"}
TWO_MIB = 2 * 1024 * 1024
UNKNOWN_ID = "00000000-0000-7000-8000-000000000000"


@dataclass
class Env:
    client: ApiClient
    key: str
    job_id: str
    tenant_id: str


@dataclass
class Case:
    name: str
    method: str
    path: str
    status: int
    type: str
    json_body: Any = None
    content: bytes | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] | None = None
    key: str | None = "tenant"  # "tenant", "admin", None, or a literal header value


def _settings(db_url: str, redis_url: str, key_prefix: str, pool: int = 4) -> Settings:
    return load_settings(database_url=db_url, redis_url=redis_url, key_prefix=key_prefix,
                         admin_key=ADMIN_KEY, policy={"pool_concurrency": pool})


@contextlib.contextmanager
def _running(db_url: str, redis_url: str, key_prefix: str, pool: int) -> Iterator[Env]:
    runtime = Runtime.from_settings(_settings(db_url, redis_url, key_prefix, pool))
    try:
        with api_client(create_app(runtime.settings, runtime)) as client:
            tenant = client.create_tenant("acme", "premium")
            key = tenant["api_key"]
            job = client.submit(key, {"kind": "echo", "payload": {}})
            assert job.status_code == 202
            yield Env(client=client, key=key, job_id=job.json()["id"], tenant_id=tenant["id"])
    finally:
        runtime.close()


@pytest.fixture
def env(
    pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[Env]:
    with _running(pg_url, redis_server.url, key_prefix, pool=4) as running:
        yield running


@pytest.fixture
def roomy_env(
    pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[Env]:
    """A pool so large that valid fuzzed jobs are admitted and stored, not refused."""
    with _running(pg_url, redis_server.url, key_prefix, pool=1000) as running:
        yield running


def _chunks(total: int) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        yield b" " * 65536
        sent += 65536


def _submit(name: str, body: Any, status: int = 422, type_: str = "invalid_request") -> Case:
    return Case(name, "POST", "/v1/jobs", status, type_, json_body=body)


def _raw(name: str, content: bytes, status: int = 422, headers: Any = None) -> Case:
    return Case(name, "POST", "/v1/jobs", status, "invalid_request", content=content,
                headers=JSON if headers is None else headers)


SLEEP = {"kind": "sleep", "payload": {"seconds": 1}}
CASES = [
    _raw("malformed json", b'{"kind": "sleep",', 400),
    _raw("empty body", b""),
    _raw("not json at all", b"\xff\xfe\x00garbage", 400),
    _raw("nesting deeper than the parser", b"[" * 200_000 + b"]" * 200_000, 400),
    _raw("a 5000-digit number", b'{"kind": "echo", "payload": {"n": ' + b"9" * 5000 + b"}}",
         400),
    _raw("NaN in the payload", b'{"kind": "echo", "payload": {"n": NaN}}'),
    _raw("lone surrogate", b'{"kind": "echo", "payload": {"s": "\\ud800"}}'),
    _raw("lone surrogate key", b'{"kind": "echo", "idempotency_key": "\\udfff"}'),
    _raw("no content type", b'{"kind": "echo"}', headers={}),
    _raw("text/plain", b'{"kind": "echo"}', headers={"content-type": "text/plain"}),
    _submit("array body", [1, 2]),
    _submit("string body", "sleep"),
    _submit("null body", None),
    _submit("missing kind", {"payload": {}}),
    _submit("kind is a number", {"kind": 5}),
    _submit("unknown kind", {"kind": "mine-bitcoin"}),
    _submit("unicode junk kind", {"kind": "💥\u202e\u0000"}),
    _submit("unknown field", {**SLEEP, "priority": 0}),
    _submit("choosing a tier", {**SLEEP, "tier": "premium"}),
    _submit("payload is a list", {"kind": "echo", "payload": [1]}),
    _submit("payload is a string", {"kind": "echo", "payload": "{}"}),
    _submit("seconds as text", {"kind": "sleep", "payload": {"seconds": "2"}}),
    _submit("seconds negative", {"kind": "sleep", "payload": {"seconds": -1}}),
    _submit("seconds too long", {"kind": "sleep", "payload": {"seconds": 99999}}),
    _submit("sleep extra field", {"kind": "sleep", "payload": {"seconds": 1, "x": 1}}),
    _submit("NUL in payload text", {"kind": "echo", "payload": {"a": "x\u0000y"}}),
    _submit("NUL in payload key", {"kind": "echo", "payload": {"\u0000": 1}}),
    _submit("NUL in idempotency key", {**SLEEP, "idempotency_key": "a\u0000"}),
    _submit("payload nested 100 deep",
            {"kind": "echo", "payload": json.loads('{"a":' * 100 + "1" + "}" * 100)}),
    _submit("empty idempotency key", {**SLEEP, "idempotency_key": ""}),
    _submit("idempotency key too long", {**SLEEP, "idempotency_key": "k" * 201}),
    _submit("idempotency key a number", {**SLEEP, "idempotency_key": 5}),
    _submit("max_wait_s zero", {**SLEEP, "max_wait_s": 0}),
    _submit("max_wait_s negative", {**SLEEP, "max_wait_s": -1}),
    _submit("max_wait_s text", {**SLEEP, "max_wait_s": "10"}),
    _submit("max_wait_s a century", {**SLEEP, "max_wait_s": 3.2e9}),
    _submit("max_attempts zero", {**SLEEP, "max_attempts": 0}),
    _submit("max_attempts 101", {**SLEEP, "max_attempts": 101}),
    _submit("max_attempts true", {**SLEEP, "max_attempts": True}),
    _submit("max_attempts 1.5", {**SLEEP, "max_attempts": 1.5}),
    Case("2 MiB body with Content-Length", "POST", "/v1/jobs", 413, "payload_too_large",
         content=b" " * TWO_MIB, headers=JSON),
    Case("2 MiB body chunked", "POST", "/v1/jobs", 413, "payload_too_large",
         content=b"<chunks>", headers=JSON),
    Case("job id not a uuid", "GET", "/v1/jobs/not-a-uuid", 404, "not_found"),
    Case("job id unknown", "GET", f"/v1/jobs/{UNKNOWN_ID}", 404, "not_found"),
    Case("job id emoji", "GET", "/v1/jobs/%F0%9F%92%A5", 404, "not_found"),
    Case("job id NUL", "GET", "/v1/jobs/%00", 404, "not_found"),
    Case("result of a non-uuid", "GET", "/v1/jobs/1'--/result", 404, "not_found"),
    Case("cancel of an unknown job", "POST", f"/v1/jobs/{UNKNOWN_ID}/cancel", 404,
         "not_found"),
    Case("unknown route", "GET", "/v1/nope", 404, "not_found", key=None),
    Case("too deep route", "GET", "/v1/jobs/a/b/c", 404, "not_found"),
    Case("wrong method on jobs", "DELETE", "/v1/jobs", 405, "invalid_request"),
    Case("wrong method on a job", "PUT", "/v1/jobs/{job}", 405, "invalid_request"),
    Case("wrong method on healthz", "POST", "/healthz", 405, "invalid_request", key=None),
    Case("wait negative", "GET", "/v1/jobs/{job}", 422, "invalid_request", params={"wait": -1}),
    Case("wait 61", "GET", "/v1/jobs/{job}", 422, "invalid_request", params={"wait": 61}),
    Case("wait abc", "GET", "/v1/jobs/{job}", 422, "invalid_request", params={"wait": "abc"}),
    Case("wait nan", "GET", "/v1/jobs/{job}", 422, "invalid_request", params={"wait": "nan"}),
    Case("limit 0", "GET", "/v1/jobs", 422, "invalid_request", params={"limit": 0}),
    Case("limit 501", "GET", "/v1/jobs", 422, "invalid_request", params={"limit": 501}),
    Case("limit text", "GET", "/v1/jobs", 422, "invalid_request", params={"limit": "many"}),
    Case("bad cursor", "GET", "/v1/jobs", 422, "invalid_request", params={"cursor": "@@@"}),
    Case("cursor of junk", "GET", "/v1/jobs", 422, "invalid_request",
         params={"cursor": "bm90LWEtdXVpZA"}),
    Case("unknown status", "GET", "/v1/jobs", 422, "invalid_request",
         params={"status": "done"}),
    Case("no authorization", "GET", "/v1/jobs", 401, "unauthorized", key=None),
    Case("bare Bearer", "GET", "/v1/jobs", 401, "unauthorized", key="Bearer"),
    Case("Basic scheme", "GET", "/v1/jobs", 401, "unauthorized", key="Basic YTpi"),
    Case("unknown key", "GET", "/v1/jobs", 401, "unauthorized", key="Bearer tq_nope"),
    Case("latin-1 key", "GET", "/v1/jobs", 401, "unauthorized", key="Bearer caf\xe9"),
    Case("queues without a key", "GET", "/v1/queues", 401, "unauthorized", key=None),
    Case("admin key submitting", "POST", "/v1/jobs", 403, "forbidden", json_body=SLEEP,
         key="admin"),
    Case("admin key reading jobs", "GET", "/v1/jobs", 403, "forbidden", key="admin"),
    Case("tenant key on admin", "GET", "/v1/admin/tenants", 403, "forbidden"),
    Case("tenant key creating", "POST", "/v1/admin/tenants", 403, "forbidden",
         json_body={"name": "evil", "tier": "premium"}),
    Case("no key on admin", "GET", "/v1/admin/tenants", 401, "unauthorized", key=None),
    Case("tenant name with spaces", "POST", "/v1/admin/tenants", 422, "invalid_request",
         json_body={"name": "bad name!", "tier": "free"}, key="admin"),
    Case("tenant name empty", "POST", "/v1/admin/tenants", 422, "invalid_request",
         json_body={"name": "", "tier": "free"}, key="admin"),
    Case("tenant tier a number", "POST", "/v1/admin/tenants", 422, "invalid_request",
         json_body={"name": "b", "tier": 1}, key="admin"),
    Case("tenant extra field", "POST", "/v1/admin/tenants", 422, "invalid_request",
         json_body={"name": "b", "tier": "free", "api_key": "mine"}, key="admin"),
    Case("patch a non-uuid tenant", "PATCH", "/v1/admin/tenants/x", 404, "not_found",
         json_body={"tier": "free"}, key="admin"),
    Case("patch to an unknown tier", "PATCH", "/v1/admin/tenants/{tenant}", 422,
         "invalid_request", json_body={"tier": "gold"}, key="admin"),
    Case("rotate an unknown tenant", "POST", f"/v1/admin/tenants/{UNKNOWN_ID}/rotate-key",
         404, "not_found", key="admin"),
]


def _send(env: Env, case: Case) -> Any:
    headers: dict[str, Any] = dict(case.headers)
    if case.key == "tenant":
        headers.update(auth(env.key))
    elif case.key == "admin":
        headers.update(auth(ADMIN_KEY))
    elif case.key is not None:
        headers["Authorization"] = case.key.encode("latin-1")
    path = case.path.replace("{job}", env.job_id).replace("{tenant}", env.tenant_id)
    kwargs: dict[str, Any] = {"headers": headers, "params": case.params}
    if case.content == b"<chunks>":
        kwargs["content"] = _chunks(TWO_MIB)
    elif case.content is not None:
        kwargs["content"] = case.content
    elif case.json_body is not None or case.method in ("POST", "PATCH"):
        kwargs["content"] = json.dumps(case.json_body).encode()
        headers.update(JSON)
    return env.client.request(case.method, path, **kwargs)


def test_each_hostile_request_gets_its_documented_error(env: Env) -> None:
    wrong = []
    for case in CASES:
        answer = _send(env, case)
        try:
            error = answer.json()["error"]
            got = (answer.status_code, error["type"], isinstance(error["message"], str))
        except (ValueError, KeyError, TypeError):
            got = (answer.status_code, f"untyped body {answer.text[:80]!r}", False)
        if got != (case.status, case.type, True):
            wrong.append(f"{case.name}: expected {case.status} {case.type}, got {got}")
    assert not wrong, "\n".join(wrong)


def test_errors_carry_their_details_and_headers(env: Env) -> None:
    client = env.client
    invalid = client.post("/v1/jobs", json={"kind": "sleep", "payload": {"seconds": "x"},
                                            "bogus": 1}, headers=auth(env.key)).json()["error"]
    locations = [detail["loc"] for detail in invalid["details"]]
    assert ["body", "bogus"] in locations
    unknown = client.post("/v1/jobs", json={"kind": "nope"}, headers=auth(env.key)).json()
    assert "nope" in unknown["error"]["message"] and unknown["error"]["details"]
    missing = client.get("/v1/jobs")
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    not_allowed = client.delete("/v1/jobs", headers=auth(env.key))
    assert set(not_allowed.headers["Allow"].split(", ")) == {"GET", "POST"}


# Numbers past what a column (SQLite's int64, PostgreSQL's int4) or a Lua number holds, and
# the non-finite floats Python's JSON parser accepts: each a 422, never a 500, on both engines.
def _patch(name: str, body: Any = None, content: bytes | None = None) -> Case:
    return Case(name, "PATCH", "/v1/admin/tenants/{tenant}", 422, "invalid_request",
                json_body=body, content=content, headers=JSON if content else {}, key="admin")


BOUND_CASES = [
    _patch("cap 2**63", {"cap": 2**63}),
    _patch("cap 2**31", {"cap": 2**31}),
    _patch("cap a million and one", {"cap": 1_000_001}),
    _patch("cap zero", {"cap": 0}),
    _patch("cap 1.5", {"cap": 1.5}),
    _patch("cap as text", {"cap": "3"}),
    _patch("max_queued 2**63", {"max_queued": 2**63}),
    _patch("max_queued 10**9 + 1", {"max_queued": 10**9 + 1}),
    _patch("rate_burst 2**63", {"rate_burst": 2**63}),
    _patch("rate_per_s 1e308", {"rate_per_s": 1e308}),
    _patch("rate_per_s zero", {"rate_per_s": 0}),
    _patch("rate_per_s NaN", content=b'{"rate_per_s": NaN}'),
    _patch("rate_per_s Infinity", content=b'{"rate_per_s": Infinity}'),
    _raw("max_wait_s NaN", b'{"kind": "echo", "max_wait_s": NaN}'),
    _raw("max_wait_s Infinity", b'{"kind": "echo", "max_wait_s": Infinity}'),
    _raw("max_wait_s -Infinity", b'{"kind": "echo", "max_wait_s": -Infinity}'),
    _submit("max_wait_s 1e308", {"kind": "echo", "max_wait_s": 1e308}),
    _submit("max_attempts 2**63", {"kind": "echo", "max_attempts": 2**63}),
    Case("wait Infinity", "GET", "/v1/jobs/{job}", 422, "invalid_request",
         params={"wait": "Infinity"}),
    Case("a misspelt query parameter", "GET", "/v1/jobs", 422, "invalid_request",
         params={"limt": 10}),
    Case("a query parameter on queues", "GET", "/v1/queues", 422, "invalid_request",
         params={"tier": "free"}),
    Case("a query parameter on a submit", "POST", "/v1/jobs", 422, "invalid_request",
         json_body=SLEEP, params={"tier": "premium"}),
]


def test_out_of_range_numbers_are_refused_on_both_engines(
    db_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    with _running(db_url, redis_server.url, key_prefix, pool=4) as running:
        wrong = []
        for case in BOUND_CASES:
            answer = _send(running, case)
            got = (answer.status_code, answer.json().get("error", {}).get("type"))
            if got != (case.status, case.type):
                wrong.append(f"{case.name}: expected {case.status} {case.type}, got {got}")
        assert not wrong, "\n".join(wrong)
        # The largest values allowed are stored and read back as sent.
        largest = {"cap": 1_000_000, "max_queued": 10**9, "rate_per_s": 1e6,
                   "rate_burst": 1_000_000}
        changed = running.client.patch(f"/v1/admin/tenants/{running.tenant_id}", json=largest,
                                       headers=auth(ADMIN_KEY))
        assert changed.status_code == 200, changed.text
        assert {name: changed.json()[name] for name in largest} == largest
        listed = running.client.get("/v1/admin/tenants", headers=auth(ADMIN_KEY)).json()
        assert [{name: t[name] for name in largest} for t in listed["tenants"]] == [largest]
        query_error = running.client.get("/v1/jobs", params={"limt": 10, "status": "queued"},
                                         headers=auth(running.key)).json()["error"]
        assert query_error["details"] == [{"loc": ["query", "limt"],
                                           "msg": "unknown query parameter"}]


JSON_LEAVES = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
SUBMIT_BODIES = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from(["sleep", "echo"]) | JSON_VALUES,
        "payload": st.fixed_dictionaries({}, optional={"seconds": JSON_VALUES,
                                                       "fail": JSON_VALUES})
        | JSON_VALUES,
        "idempotency_key": JSON_VALUES,
        "max_wait_s": JSON_VALUES,
        "max_attempts": JSON_VALUES,
        "tier": JSON_VALUES,
    },
)

# Mostly valid bodies, so the fuzz also reaches admission and the SQL insert.
ECHO_BODIES = st.fixed_dictionaries(
    {"kind": st.just("echo"),
     "payload": st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4)},
    optional={"idempotency_key": st.text(min_size=1, max_size=30),
              "max_wait_s": st.floats(0.001, 1e6), "max_attempts": st.integers(1, 100)},
)
SLEEP_BODIES = st.fixed_dictionaries(
    {"kind": st.just("sleep"),
     "payload": st.fixed_dictionaries({"seconds": st.floats(0, 3600) | st.integers(0, 3600)},
                                      optional={"fail": st.booleans()})},
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=SUBMIT_BODIES | ECHO_BODIES | SLEEP_BODIES | JSON_VALUES)
def test_fuzzed_submit_bodies_never_break_the_api(roomy_env: Env, body: Any) -> None:
    answer = roomy_env.client.post("/v1/jobs", content=json.dumps(body).encode(),
                                   headers={**auth(roomy_env.key), **JSON})
    event(f"status {answer.status_code}")
    assert answer.status_code in {200, 202, 400, 409, 413, 422, 429}, answer.text
    if answer.status_code >= 400:
        error = answer.json()["error"]
        assert isinstance(error["type"], str) and isinstance(error["message"], str)
    else:
        assert answer.json()["status"] == "queued"


# -- backends down ---------------------------------------------------------------------------


def test_redis_unreachable_gives_503_not_500(pg_url: str, key_prefix: str) -> None:
    settings = _settings(pg_url, "redis://127.0.0.1:1/0", key_prefix)
    runtime = Runtime.from_settings(settings)
    try:
        tenant, key = create_tenant(runtime, name="acme", tier="free")
        stored = NewJob(tenant_id=tenant.id, tier="free", kind="echo", payload={},
                        order_key=1.0, enqueued_at=runtime.clock())
        with runtime.sessions.begin() as session:
            jobs_sql.insert_job(session, stored)
        with api_client(create_app(settings, runtime)) as client:
            refused = client.post("/v1/jobs", json=SLEEP, headers=auth(key))
            assert refused.status_code == 503
            assert refused.json()["error"]["type"] == "unavailable"
            assert int(refused.headers["Retry-After"]) >= 1
            with runtime.sessions.begin() as session:
                assert len(jobs_sql.list_jobs(session, tenant_id=tenant.id)[0]) == 1
            ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["error"]["type"] == "unavailable"
            assert client.get("/healthz").status_code == 200
            # Status reads keep working from SQL; only the live queue position is unknown.
            view = client.get(f"/v1/jobs/{stored.id}", headers=auth(key))
            assert view.status_code == 200 and view.json()["queue_position"] is None
            assert client.get("/v1/queues", headers=auth(key)).status_code == 503
            assert 'tierq_backend_up{backend="redis"} 0.0' in client.get("/metrics").text
    finally:
        runtime.close()


def test_database_unreachable_gives_503_not_500(
    redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    settings = _settings("postgresql+psycopg://postgres@127.0.0.1:1/none", redis_server.url,
                         key_prefix)
    with api_client(create_app(settings)) as client:
        for answer in (
            client.post("/v1/jobs", json=SLEEP, headers=auth("tq_any")),
            client.get("/v1/admin/tenants", headers=auth(ADMIN_KEY)),
            client.get("/readyz"),
        ):
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["type"] == "unavailable"
            assert int(answer.headers["Retry-After"]) >= 1
        assert client.get("/healthz").status_code == 200
        assert client.get("/metrics").status_code == 200


class BrokenValidator:
    """A handler registry with a bug: what a 500 looks like (typed, logged, no traceback)."""

    def validate(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("secret internals")


def test_a_bug_is_a_typed_500_without_a_traceback(
    pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = Runtime.from_settings(_settings(pg_url, redis_server.url, key_prefix))
    try:
        _, key = create_tenant(runtime, name="acme", tier="free")
        app = create_app(runtime.settings, runtime, validator=BrokenValidator())
        with api_client(app) as client:
            answer = client.post("/v1/jobs", json=SLEEP, headers=auth(key))
        assert answer.status_code == 500
        assert answer.json()["error"]["type"] == "internal"
        assert "secret" not in answer.text and "Traceback" not in answer.text
        assert any(record.message == "api.internal_error" for record in caplog.records)
    finally:
        runtime.close()
