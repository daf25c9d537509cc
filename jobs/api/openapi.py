"""The OpenAPI document, completed with what only this deployment knows.

FastAPI derives the document from the routes and schemas; what the pydantic models cannot
say is filled in once, on the first request for it: the job kinds the handler registry has
(the ``kind`` enum), the configured tiers (the ``tier`` enums of the tenant requests), both
also for the job searches' filters, and the error types (``jobs.api.errors.ERROR_TYPES``). A
client generated from the document, and schemathesis, then know the values the server accepts
instead of guessing at free text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI

from jobs.api.errors import ERROR_TYPES

Schema = dict[str, Any]


def install_openapi(
    app: FastAPI, *, tiers: Sequence[str], kinds: Sequence[str] | None
) -> None:
    """Make ``app.openapi()`` answer the completed document (``kinds``: None leaves the
    ``kind`` field free text, for a validator that cannot list its kinds)."""
    derive: Callable[[], Schema] = app.openapi

    def openapi() -> Schema:
        if app.openapi_schema is None:
            complete(derive(), tiers=tiers, kinds=kinds)  # derive() caches what it builds
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(document: Schema, *, tiers: Sequence[str], kinds: Sequence[str] | None) -> None:
    schemas: dict[str, Schema] = document["components"]["schemas"]
    if kinds is not None:
        _enum(schemas["SubmitRequest"]["properties"]["kind"], kinds)
    _enum(schemas["TenantCreateRequest"]["properties"]["tier"], tiers)
    _enum(schemas["TenantPatchRequest"]["properties"]["tier"], tiers)
    _enum(schemas["ErrorDetail"]["properties"]["type"], list(ERROR_TYPES))
    schemas["Status"]["description"] = STATUS_DESCRIPTION
    for path in SEARCHES:  # the job explorer's filters
        for param in document["paths"].get(path, {}).get("get", {}).get("parameters", []):
            if param["name"] == "tier":
                _enum(param["schema"], tiers)
            elif param["name"] == "kind" and kinds is not None:
                _enum(param["schema"], kinds)


SEARCHES = ("/v1/jobs", "/v1/admin/jobs")


STATUS_DESCRIPTION = (
    "queued: waiting for a slot; dispatched: sent to a worker; running: its handler runs; "
    "succeeded, failed, cancelled, expired (not started within max_wait_s, never computed): "
    "terminal. docs/states.md draws the moves."
)


def _enum(prop: Schema, values: Sequence[str]) -> None:
    """Restrict a string property (or the string branch of a nullable one) to ``values``."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == "string":
            branch["enum"] = list(values)
            return
    raise ValueError(f"no string schema to restrict in {prop!r}")
