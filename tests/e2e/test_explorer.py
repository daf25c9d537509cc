"""The job explorer in a real browser: headless Chromium (the machine's own, driven by
playwright) against API, dispatcher and Celery worker as separate processes on PostgreSQL +
Redis, as in test_dashboard.py.

The admin searches every tenant's jobs by status and kind, opens a failed job's page (its
payload, times, error and error_type), retries it and opens the new job from the link, and
cancels a running job. A tenant's dashboard lists only its own jobs, cannot open another
tenant's, and cancels its own queued job.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from playwright.sync_api import Browser, Page, sync_playwright

from tests.e2e.harness import ADMIN_KEY, System, started_system, wait_status, wait_terminal
from tests.e2e.test_dashboard import CONFIG, chromium_path, key_of, open_page
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

WAIT_MS = 20_000


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def system(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
) -> Iterator[System]:
    with started_system(tmp_path, config=CONFIG, concurrency=2, database_url=pg_url,
                        redis_url=redis_server.url, key_prefix=key_prefix) as deployment:
        yield deployment


def submitted(client: httpx.Client, kind: str, payload: dict[str, object]) -> str:
    answer = client.post("/v1/jobs", json={"kind": kind, "payload": payload})
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


def search(page: Page, **filters: str) -> list[str]:
    """Fill the search form, run it, and return the ids listed, in order."""
    page.wait_for_selector("#explorer:not([hidden])")
    page.select_option('#search-form select[name="status"]', filters.pop("status", ""))
    for name in ("kind", "tier"):
        page.fill(f'#search-form input[name="{name}"]', filters.pop(name, ""))
    assert not filters
    page.evaluate("document.getElementById('results').dataset.state = 'asked'")
    page.click('#search-form button[type="submit"]')
    page.wait_for_selector('#results[data-state="done"]', timeout=WAIT_MS)
    rows = page.locator("#results tbody tr")
    return [rows.nth(i).get_attribute("data-job") or "" for i in range(rows.count())]


def open_job(page: Page, job_id: str) -> None:
    page.evaluate("id => { window.location.hash = '#job/' + id; }", job_id)
    page.wait_for_selector(f'#job[data-job="{job_id}"]:not([data-state="loading"])',
                           timeout=WAIT_MS)


def shown(page: Page, field: str) -> str:
    return page.inner_text(f'#job [data-field="{field}"]')


def test_the_admin_searches_reads_retries_and_cancels(
    system: System, browser: Browser, tmp_path: Path
) -> None:
    acme = system.tenant("acme", "premium")
    globex = system.tenant("globex", "standard")
    system.wait_for_capacity(acme, 2)
    failed = submitted(acme, "sleep", {"seconds": 0.1, "fail": True})
    echoed = submitted(acme, "echo", {"text": "x" * 10_000})
    theirs = submitted(globex, "echo", {"who": "globex"})
    for job_id, client in ((failed, acme), (echoed, acme), (theirs, globex)):
        wait_terminal(client, job_id)
    running = submitted(acme, "sleep", {"seconds": 120})
    wait_status(acme, running, "running")

    page = open_page(browser, system.url, ADMIN_KEY)
    page.wait_for_selector('body[data-view="fleet"]')
    page.click('#nav [data-route="jobs"]')
    assert search(page, status="running") == [running]
    assert search(page, kind="echo") == [theirs, echoed]  # every tenant's, newest first
    assert page.inner_text(f'#results tr[data-job="{theirs}"]').count("globex") == 1
    page.screenshot(path=str(tmp_path / "explorer.png"))

    assert search(page, status="failed", kind="sleep") == [failed]
    page.click(f'#results a[data-job-link="{failed}"]')
    page.wait_for_selector(f'#job[data-job="{failed}"][data-state="ended"]', timeout=WAIT_MS)
    assert shown(page, "status") == "failed"
    assert shown(page, "kind") == "sleep" and shown(page, "tenant").startswith("acme (")
    assert '"fail": true' in shown(page, "payload")
    for time_field in ("created-at", "enqueued-at", "started-at", "finished-at"):
        assert shown(page, time_field).endswith("Z"), time_field
    assert shown(page, "error") not in ("", "–")
    assert shown(page, "error-type") == "handler_error"
    assert shown(page, "starts") == "1"
    # The deliveries are fetched apart: whatever they answer, the page stands.
    page.wait_for_selector('#job [data-field="deliveries"] [data-state], '
                           '#job [data-table="deliveries"]', timeout=WAIT_MS)
    assert page.locator('#job [data-action="cancel"]').count() == 0
    page.screenshot(path=str(tmp_path / "explorer-job.png"), full_page=True)

    page.click('#job [data-action="retry"]')
    link = page.locator('#job [data-field="notice"] a')
    link.wait_for(timeout=WAIT_MS)
    retried = link.get_attribute("data-job-link") or ""
    assert retried and retried != failed
    link.click()
    page.wait_for_selector(f'#job[data-job="{retried}"]:not([data-state="loading"])',
                           timeout=WAIT_MS)
    assert shown(page, "retry-of") == failed
    assert shown(page, "tenant").startswith("acme (")

    open_job(page, echoed)
    assert "10011 bytes" in page.inner_text('#job [data-field="payload-cut"]')  # compact JSON
    assert len(shown(page, "payload")) < 5_000

    open_job(page, running)
    assert shown(page, "status") == "running"
    page.click('#job [data-action="cancel"]')
    page.wait_for_selector(f'#job[data-job="{running}"][data-status="cancelled"]',
                           timeout=30_000)
    assert acme.get(f"/v1/jobs/{running}").json()["status"] == "cancelled"


def test_a_tenant_sees_and_acts_on_its_own_jobs_only(system: System, browser: Browser) -> None:
    acme = system.tenant("acme", "premium")
    globex = system.tenant("globex", "standard")
    system.wait_for_capacity(acme, 2)
    mine = submitted(acme, "echo", {"n": 1})
    theirs = submitted(globex, "echo", {"secret": "globex-only"})
    for job_id, client in ((mine, acme), (theirs, globex)):
        wait_terminal(client, job_id)
    # acme may run one job at once (its cap): a long one holds it, the next one waits.
    blocker = submitted(acme, "sleep", {"seconds": 120})
    wait_status(acme, blocker, "running")
    queued = submitted(acme, "sleep", {"seconds": 1})

    page = open_page(browser, system.url, key_of(acme))
    page.wait_for_selector('body[data-view="tenant"]')
    assert page.is_hidden('#search-form [name="tenant"]')
    page.click('#nav [data-route="jobs"]')
    assert search(page) == [queued, blocker, mine]
    assert search(page, kind="echo") == [mine]
    assert theirs not in page.content() and "globex" not in page.content()

    open_job(page, theirs)
    assert page.get_attribute("#job", "data-state") == "missing"
    assert "globex-only" not in page.content()

    open_job(page, queued)
    assert shown(page, "status") == "queued"
    page.click('#job [data-action="cancel"]')
    page.wait_for_selector(f'#job[data-job="{queued}"][data-status="cancelled"]',
                           timeout=WAIT_MS)
    assert acme.get(f"/v1/jobs/{queued}").json()["status"] == "cancelled"
    acme.post(f"/v1/jobs/{blocker}/cancel")
