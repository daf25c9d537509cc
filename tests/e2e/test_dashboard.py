"""The dashboard in a real browser: headless Chromium (the machine's own, driven by
playwright) against API, dispatcher and Celery worker as separate processes on PostgreSQL +
Redis.

The admin's page shows a card per tier; after tenants of every tier submit work its figures
move (queued, in flight, a refusal, the tenants nearest their cap) without a reload. A
tenant's page shows its own tier and figures and no other tenant. With a second pool
configured, the page lists every pool (one with no worker yet says so) and each worker's
pool, and a worker that joins that pool shows up. A screenshot of the fleet's page is kept
with the test's files; with ``TIERQ_SCREENSHOT_DIR`` set it is also written
there: ``TIERQ_SCREENSHOT_DIR=docs/img .venv/bin/pytest tests/e2e/test_dashboard.py`` renews
the README's picture.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from playwright.sync_api import Browser, Page, sync_playwright

from tests.e2e.harness import ADMIN_KEY, System, started_system, wait_until
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CHROMIUM = "/usr/bin/chromium"
INSTALL = "apt-get install -y --no-install-recommends chromium"
# Four slots; a fallback service time of 0.5 s gives bounds and quotas with room to spare.
CONFIG = "[policy]\nmean_service_s = 0.5\n"
# The same, with a pool ``gpu`` for ``echo`` jobs: its workers start in the test.
POOLED = CONFIG + '[pools.gpu]\nkinds = ["echo"]\n'
WIDTH, HEIGHT = 1366, 768
TIERS = ["premium", "standard", "free"]


def chromium_path() -> str:
    found = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if found is None:
        pytest.fail(f"the dashboard test drives the machine's Chromium: {INSTALL}", pytrace=False)
    return found


@pytest.fixture
def browser() -> Iterator[Browser]:
    path = chromium_path()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=path, headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(params=[CONFIG], ids=["one pool"])
def system(
    request: pytest.FixtureRequest, tmp_path: Path, pg_url: str, redis_server: RedisServer,
    key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
) -> Iterator[System]:
    config: str = request.param
    with started_system(tmp_path, config=config, concurrency=4, database_url=pg_url,
                        redis_url=redis_server.url, key_prefix=key_prefix) as deployment:
        yield deployment


def key_of(client: httpx.Client) -> str:
    return client.headers["Authorization"].removeprefix("Bearer ")


def open_page(browser: Browser, url: str, key: str) -> Page:
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    page.goto(f"{url}/dashboard#key={key}")
    return page


def shown(page: Page, tier: str, field: str) -> str:
    return page.inner_text(f'[data-tier="{tier}"] [data-field="{field}"]')


def submit(client: httpx.Client, jobs: int, seconds: float) -> list[int]:
    return [client.post("/v1/jobs", json={"kind": "sleep", "payload": {"seconds": seconds}})
            .status_code for _ in range(jobs)]


def test_the_fleet_and_a_tenant_in_the_browser(
    system: System, browser: Browser, tmp_path: Path
) -> None:
    acme = system.tenant("acme", "premium")
    globex = system.tenant("globex", "standard")
    initech = system.tenant("initech", "free")
    with system.admin() as admin:  # acme may run two at once; initech may queue five
        wait_until(lambda: admin.get("/v1/dashboard").json()["pool"]["capacity"] >= 4)
        ids = {t["name"]: t["id"] for t in admin.get("/v1/admin/tenants").json()["tenants"]}
        for name, change in (("acme", {"cap": 2}), ("initech", {"max_queued": 5})):
            answer = admin.patch(f"/v1/admin/tenants/{ids[name]}", json=change)
            assert answer.status_code == 200, answer.text

    page = open_page(browser, system.url, ADMIN_KEY)
    page.wait_for_selector('body[data-view="fleet"]')
    assert "key=" not in page.url  # the key left the address bar for sessionStorage
    cards = page.locator("[data-tier]")
    assert [cards.nth(i).get_attribute("data-tier") for i in range(cards.count())] == TIERS
    assert [shown(page, tier, "queued") for tier in TIERS] == ["0", "0", "0"]
    assert page.inner_text('[data-card="pool"] [data-field="inflight"]') == "0"
    # The live worker of this host: its slots on its device.
    workers = page.inner_text('[data-card="pool"] [data-field="workers"]')
    assert workers == "1 worker: 4 slots on cpu"
    assert page.locator('[data-card="pools"]').count() == 0  # one pool: no pools table

    assert submit(acme, 5, 2.0) == [202] * 5
    assert submit(globex, 6, 2.0) == [202] * 6
    # Over its quota of five queued jobs: refused with 429 tenant_limit (quota).
    assert 429 in submit(initech, 8, 1.5)

    page.wait_for_function(
        """() => {
          const text = (sel) => (document.querySelector(sel) || {}).textContent;
          return text('[data-tier="free"] [data-field="queued"]') !== "0"
            && text('[data-card="pool"] [data-field="inflight"]') !== "0";
        }""", timeout=20_000)
    free = page.locator('[data-tier="free"]')
    assert "tenant_limit · quota" in free.inner_text()
    page.wait_for_selector('[data-card="tenants"] tr[data-tenant="acme"]', timeout=20_000)
    # Three more refreshes: the charts draw the queues draining.
    drawn = int(page.get_attribute("body", "data-refreshes") or 0)
    page.wait_for_function(f"() => Number(document.body.dataset.refreshes) >= {drawn + 3}",
                           timeout=20_000)
    screenshot = tmp_path / "dashboard.png"
    page.screenshot(path=str(screenshot))
    assert screenshot.stat().st_size > 10_000
    target = os.environ.get("TIERQ_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(screenshot, Path(target) / "dashboard.png")

    own = open_page(browser, system.url, key_of(initech))
    own.wait_for_selector('body[data-view="tenant"] [data-card="own"]')
    own_cards = own.locator("[data-tier]")
    assert own_cards.count() == 1 and own_cards.first.get_attribute("data-tier") == "free"
    text = own.inner_text("body")
    assert "initech" in text and "tenant_limit · quota" in text
    for other in ("acme", "globex"):
        assert other not in own.content()
    own.screenshot(path=str(tmp_path / "dashboard-tenant.png"))

    wrong = open_page(browser, system.url, "not-a-key")
    wrong.wait_for_selector("#key-error:not([hidden])")
    assert "not known" in wrong.inner_text("#key-error")
    assert wrong.is_hidden("#board")


def pool_row(page: Page, pool: str) -> list[str]:
    cells = page.locator(f'[data-table="pools"] tr[data-pool="{pool}"] td')
    return [cells.nth(i).inner_text() for i in range(cells.count())]


@pytest.mark.parametrize("system", [POOLED], ids=["two pools"], indirect=True)
def test_every_pool_and_each_workers_pool_in_the_browser(
    system: System, browser: Browser, tmp_path: Path
) -> None:
    acme = system.tenant("acme", "premium")
    with system.admin() as admin:
        wait_until(lambda: admin.get("/v1/dashboard").json()["pool"]["capacity"] >= 4)

    page = open_page(browser, system.url, ADMIN_KEY)
    page.wait_for_selector('[data-card="pools"] tr[data-pool="gpu"]')
    assert page.inner_text('[data-card="pool"] h2 span') == "Pool default"
    assert pool_row(page, "default")[:4] == ["default", "every other kind", "1", "0 / 4"]
    assert pool_row(page, "gpu")[:4] == ["gpu", "echo", "no live worker", "0 / 0"]
    workers = page.locator('[data-table="workers"] tbody tr')
    assert workers.count() == 1 and workers.first.get_attribute("data-pool") == "default"

    system.start("worker-gpu", "worker", "--pool", "gpu", "--concurrency", "1")
    page.wait_for_function(
        """() => document.querySelectorAll('[data-table="workers"] tr[data-pool="gpu"]')
          .length === 1""", timeout=60_000)
    page.wait_for_function(
        """() => (document.querySelector(
          '[data-table="pools"] tr[data-pool="gpu"] [data-field="live-workers"]') || {})
          .textContent === '1'""", timeout=20_000)
    assert pool_row(page, "gpu")[3] == "0 / 1"
    page.screenshot(path=str(tmp_path / "dashboard-pools.png"))

    own = open_page(browser, system.url, key_of(acme))
    own.wait_for_selector('[data-card="own"] [data-table="own-pools"] tr[data-pool="gpu"]')
    assert "(pool default)" in own.inner_text('[data-card="own"]')
    own.screenshot(path=str(tmp_path / "dashboard-pools-tenant.png"))
