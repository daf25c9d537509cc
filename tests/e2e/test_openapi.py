"""The contract in the repository: the OpenAPI document a live ``tierq api`` serves, and
docs/api.md, say the same thing, and the document says it completely.

- every route of the document is in docs/api.md's route table and back; every error type
  the API answers with, every setting and every command is in docs/api.md;
- every route and field of the document has a description; tiers, kinds, statuses and
  error types are enums; the numbers a client sends are bounded; every error status is
  declared with the one error body;
- ``/docs`` and ``/redoc`` work offline: every asset they load comes from the app itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlparse

import httpx
import pytest
import typer.main
from pydantic import BaseModel

from jobs.api.errors import ERROR_TYPES
from jobs.cli.main import build_app
from jobs.core import errors
from jobs.process.settings import KindSettings, PoolSettings, Settings, TierSettings
from tests.e2e.live_api import live_api
from tests.services import RedisServer
from workers.embedding import models_installed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
# Routes that need no key (everything else declares 401): the dashboard's page asks for one.
OPEN = {("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics"), ("get", "/dashboard")}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[str]:
    with live_api(tmp_path_factory.mktemp("openapi"), redis_server) as system:
        yield system.url


@pytest.fixture(scope="module")
def document(api: str) -> dict[str, Any]:
    answer = httpx.get(f"{api}/openapi.json", timeout=10)
    assert answer.status_code == 200
    body: dict[str, Any] = answer.json()
    return body


def section(title: str) -> str:
    """The text of docs/api.md under the heading ``title``, down to the next heading of
    the same or a higher level."""
    text = DOCS.read_text()
    match = re.search(rf"^(#+) {re.escape(title)}\n", text, re.MULTILINE)
    assert match, f"docs/api.md has no section {title!r}"
    level = len(match.group(1))
    rest = text[match.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield method, path, operation


# -- the document and docs/api.md ------------------------------------------------------------


def test_the_routes_of_the_document_are_the_routes_documented(
    document: dict[str, Any]
) -> None:
    served = {(method.upper(), path) for method, path, _ in _operations(document)}
    table = section("Routes")
    documented = set(re.findall(r"^\| `([A-Z]+) (/\S*)` \|", table, re.MULTILINE))
    assert documented, "no route table found"
    assert served - documented == set(), "routes served but not documented"
    assert documented - served == set(), "routes documented but not served"


def test_every_error_type_is_documented(document: dict[str, Any]) -> None:
    # Other classes of status 500 and up are internal signals: answered as "internal".
    raised = {cls.type for cls in _error_classes()
              if 400 <= cls.status < 500 or issubclass(cls, errors.Unavailable)}
    assert raised <= set(ERROR_TYPES), "an error class whose type the API does not list"
    table = section("Errors")
    documented = set(re.findall(r"^\| `([a-z_]+)` \| \d", table, re.MULTILINE))
    assert documented == set(ERROR_TYPES)
    for name, error_type in ERROR_TYPES.items():
        row = re.search(rf"^\| `{name}` \| ([\d, ]+) \|", table, re.MULTILINE)
        assert row is not None
        assert {int(s) for s in row.group(1).split(",")} == set(error_type.statuses), name
    detail = document["components"]["schemas"]["ErrorDetail"]["properties"]["type"]
    assert detail["enum"] == list(ERROR_TYPES)


def _error_classes() -> Iterator[type[errors.TierqError]]:
    """Every error class with a fixed type (JobGone's types are in ERROR_TYPES by name)."""
    stack = [errors.TierqError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if "type" in vars(cls) and cls.__module__ == errors.__name__:
            yield cls


def test_every_setting_is_documented() -> None:
    table = section("Settings")
    documented = set(re.findall(r"^\| `([a-z_.<>]+)` \|", table, re.MULTILINE))
    assert set(_settings(Settings)) == documented


def _settings(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Dotted names of every setting: ``policy.ageing_rate_s``, ``tiers.<name>.max_wait_s``."""
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _settings(kind, f"{prefix}{name}.")
        elif name == "tiers":  # dict[str, TierSettings]
            yield from _settings(TierSettings, f"{prefix}tiers.<name>.")
        elif name == "pools":  # dict[str, PoolSettings]
            yield from _settings(PoolSettings, f"{prefix}pools.<name>.")
        elif name == "kinds" and not prefix:  # dict[str, KindSettings]
            yield from _settings(KindSettings, f"{prefix}kinds.<kind>.")
        else:
            yield f"{prefix}{name}"


def test_every_command_is_documented() -> None:
    table = section("The command line")
    documented = set(re.findall(r"^\| `tierq ([a-z -]+?)(?: [A-Z\[]|`)", table, re.MULTILINE))
    assert set(_commands(typer.main.get_command(build_app()))) == documented


def _commands(group: Any, prefix: str = "") -> Iterator[str]:
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}"


# -- the document is complete ----------------------------------------------------------------


def test_every_route_parameter_and_field_is_described(document: dict[str, Any]) -> None:
    missing = []
    for method, path, operation in _operations(document):
        for key in ("summary", "description"):
            if not operation.get(key):
                missing.append(f"{method} {path}: {key}")
        missing += [f"{method} {path}: parameter {p['name']}"
                    for p in operation.get("parameters", []) if not p.get("description")]
        missing += [f"{method} {path}: response {status}"
                    for status, response in operation["responses"].items()
                    if not response.get("description")]
    for name, schema in document["components"]["schemas"].items():
        if not schema.get("description"):
            missing.append(f"schema {name}")
        missing += [f"{name}.{field}" for field, prop in schema.get("properties", {}).items()
                    if not prop.get("description")]
    assert not missing


def test_tiers_kinds_statuses_and_bounds(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    models = ["document.embed", "eval.similarity"] if models_installed() else []
    assert _branch(schemas["SubmitRequest"]["properties"]["kind"])["enum"] == sorted(
        ["echo", "sleep", *models])
    tiers = ["free", "premium", "standard"]
    assert _branch(schemas["TenantCreateRequest"]["properties"]["tier"])["enum"] == tiers
    assert _branch(schemas["TenantPatchRequest"]["properties"]["tier"])["enum"] == tiers
    assert schemas["Status"]["enum"] == ["waiting", "queued", "dispatched", "running", "succeeded",
                                         "failed", "cancelled", "expired"]
    submit = schemas["SubmitRequest"]["properties"]
    assert _bounds(submit["max_wait_s"]) == (0, 30 * 24 * 3600)
    assert _bounds(submit["max_attempts"]) == (1, 100)
    patch = schemas["TenantPatchRequest"]["properties"]
    assert _bounds(patch["cap"]) == (1, 1_000_000)
    assert _bounds(patch["max_queued"]) == (1, 10**9)
    assert _bounds(patch["rate_per_s"]) == (0, 1e6)
    assert _bounds(patch["rate_burst"]) == (1, 1_000_000)
    params = {(path, p["name"]): p["schema"] for _, path, op in _operations(document)
              for p in op.get("parameters", [])}
    assert _bounds(params[("/v1/jobs/{job_id}", "wait")]) == (0, 60)
    assert _bounds(params[("/v1/jobs", "limit")]) == (1, 500)
    assert _branch(params[("/v1/jobs", "status")]) == {"$ref": "#/components/schemas/Status"}
    for name in ("SubmitRequest", "TenantCreateRequest", "TenantPatchRequest"):
        assert schemas[name]["examples"], name


def _branch(prop: dict[str, Any]) -> dict[str, Any]:
    """The non-null branch of a nullable property (or the property)."""
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    assert len(branches) == 1
    return branches[0]


def _bounds(prop: dict[str, Any]) -> tuple[float, float]:
    branch = _branch(prop)
    low = branch.get("minimum", branch.get("exclusiveMinimum"))
    return low, branch["maximum"]


def test_every_error_status_has_the_error_body(document: dict[str, Any]) -> None:
    for method, path, operation in _operations(document):
        responses = operation["responses"]
        if (method, path) not in OPEN:
            assert "401" in responses, (method, path)
        for status, response in responses.items():
            if int(status) >= 400:
                schema = response["content"]["application/json"]["schema"]
                assert schema == ERROR_REF, (method, path, status)
    submit = document["paths"]["/v1/jobs"]["post"]["responses"]
    assert "idempotency_conflict" in submit["409"]["description"]
    assert set(submit["429"]["headers"]) == {"Retry-After", "X-Queue-Position", "X-Tier"}
    result = document["paths"]["/v1/jobs/{job_id}/result"]["get"]["responses"]
    assert {"job_failed"} <= set(re.findall(r"`(\w+)`", result["409"]["description"]))
    assert {"job_cancelled", "job_expired"} <= set(
        re.findall(r"`(\w+)`", result["410"]["description"]))


# -- /docs offline ---------------------------------------------------------------------------


class _Assets(HTMLParser):
    """The URLs a page loads: ``src``, ``href`` and ReDoc's ``spec-url`` attributes, and
    quoted URLs in its inline scripts (Swagger UI's ``url: '/openapi.json'``)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_script = tag == "script"
        self.urls += [value for name, value in attrs
                      if name in ("src", "href", "spec-url") and value]

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.urls += re.findall(r"""['"]((?:https?:)?//[^'"]+|/[^'"\s]+)['"]""", data)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_load_everything_from_the_app(api: str, page: str) -> None:
    answer = httpx.get(f"{api}{page}", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    parser = _Assets()
    parser.feed(answer.text)
    urls = {urljoin(f"{api}{page}", url) for url in parser.urls}
    assert any(url.endswith(".js") for url in urls)
    assert f"{api}/openapi.json" in urls
    for url in sorted(urls):
        assert urlparse(url).netloc == urlparse(api).netloc, f"{page} loads {url} from outside"
        asset = httpx.get(url, timeout=10)
        assert asset.status_code == 200, url
        assert asset.content, url
