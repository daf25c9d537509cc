"""``/dashboard`` (the page) and ``/v1/dashboard`` (its figures).

The page is a static shell shipped in the package (``jobs/dashboard/static``: HTML, one
script, one stylesheet, no CDN); it needs no key to load. The key is typed into the page (or
passed as ``#key=<key>``, a fragment the browser never sends) and kept in the tab's
``sessionStorage``; the script sends it as ``Authorization: Bearer`` to ``/v1/dashboard``
every two seconds. The admin key sees the fleet, a tenant's key its own view.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from jobs.api.dashboard_schemas import DashboardResponse
from jobs.api.deps import PrincipalDep, RuntimeDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.dashboard import reads

STATIC_DIR = Path(__file__).resolve().parents[2] / "dashboard" / "static"
ASSETS_PATH = "/dashboard/assets"

router = APIRouter(tags=["dashboard"], dependencies=[Depends(refuse_unknown_query)])


def assets() -> StaticFiles:
    """The page's script and stylesheet, mounted at ``ASSETS_PATH``."""
    return StaticFiles(directory=STATIC_DIR)


@cache
def _page() -> str:
    return (STATIC_DIR / "index.html").read_text(encoding="utf-8")


@router.get(
    "/dashboard",
    response_class=HTMLResponse,
    summary="The dashboard page",
    description="An HTML page that shows `/v1/dashboard` and refreshes itself every 2 s: the "
    "fleet with the admin key, a tenant's own view with its key. The page itself needs no "
    "key: it asks for one and sends it only as `Authorization: Bearer`. Its assets are served "
    f"from `{ASSETS_PATH}/`, never a CDN.",
    responses={200: {"content": {"text/html": {}}, "description": "the page"}},
)
def dashboard_page() -> HTMLResponse:
    return HTMLResponse(_page(), headers={"Cache-Control": "no-cache"})


@router.get(
    "/v1/dashboard",
    response_model=DashboardResponse,
    summary="The dashboard's figures",
    description="The admin key: every tier (queued against its bound, oldest age against its "
    "ageing guarantee, waits against max_wait_s, refusals by cause and limit), the pool, "
    "every pool ([pools.NAME]) and its live workers, and in each pool the tenants nearest "
    "their cap. A tenant's key: its tier's card with its own refusals, its cap and quota use "
    "in each pool, its waits and its latest jobs; nothing of any other tenant. Tiers and "
    "`pool` are the default pool's.",
    responses=error_responses("unauthorized", "unavailable"),
)
def get_dashboard(principal: PrincipalDep, runtime: RuntimeDep) -> DashboardResponse:
    if principal.tenant is None:
        return DashboardResponse.of_fleet(reads.fleet(runtime))
    return DashboardResponse.of_tenant(reads.of_tenant(runtime, principal.tenant))
