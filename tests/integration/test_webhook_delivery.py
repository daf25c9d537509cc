"""The deliverer against real receivers on loopback, on SQLite and PostgreSQL: one tenant's
backlog at a receiver that hangs holds up no other tenant's delivery.

The events are written into the outbox as the trigger of migration 0013 writes them (its
own tests are in ``test_webhook_outbox.py``); what a delivery carries comes from a render
of the test's (the deliverer's own seam), since these events' jobs are not stored.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from jobs.process.runtime import Runtime
from jobs.service.deliverer import Deliverer
from jobs.store import tenants as tenants_sql
from jobs.store import webhooks as repo
from jobs.store.rows import dt
from jobs.store.webhooks import Event
from tests.integration.api_harness import make_settings
from tests.services import RedisServer
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime(
    db_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[Runtime]:
    """A dispatcher's connections; loopback receivers allowed (``webhook_allow_private``)."""
    settings = make_settings(db_url, redis_server.url, key_prefix).model_copy(
        update={"webhook_allow_private": True})
    made = Runtime.from_settings(settings)
    yield made
    made.close()


def render(event: Event) -> dict[str, Any]:
    return {"id": event.job_id}


def tenant(runtime: Runtime, name: str) -> str:
    with runtime.sessions.begin() as session:
        return tenants_sql.create_tenant(session, name=name, tier="free",
                                         api_key_hash=f"hash-{name}", now=runtime.clock()).id


def record(runtime: Runtime, tenant_id: str, url: str, count: int, *, due_at: float
           ) -> list[str]:
    """``count`` events of ``tenant_id``'s jobs, due at ``due_at`` (oldest first)."""
    rows = [{"id": f"msg_{uuid.uuid4().hex}", "tenant_id": tenant_id,
             "job_id": str(uuid.uuid4()), "batch_id": None, "type": "job.completed",
             "url": url, "created_at": dt(due_at), "next_attempt_at": dt(due_at + i * 1e-3)}
            for i in range(count)]
    with runtime.sessions.begin() as session:
        session.execute(sa.insert(repo.EVENTS), rows)
    return [row["id"] for row in rows]


def poll(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)
    return found


@pytest.fixture
def released() -> Iterator[threading.Event]:
    """Set at the end of the test: a receiver that hangs until then answers at last."""
    event = threading.Event()
    yield event
    event.set()


def test_a_tenants_backlog_at_a_hanging_receiver_holds_up_no_other_tenant(
    runtime: Runtime, released: threading.Event
) -> None:
    hanging = Receiver(0, lambda got, tries: 204 if released.wait(30) else 504)
    prompt = Receiver(0, lambda got, tries: 204)
    busy, other = tenant(runtime, "busy"), tenant(runtime, "other")
    now = runtime.clock()
    record(runtime, busy, hanging.url, 200, due_at=now - 60)
    (waiting,) = record(runtime, other, prompt.url, 1, due_at=now - 1)  # due after all 200
    deliverer = Deliverer(runtime, render, concurrency=16, tenant_concurrency=4,
                          timeout_s=1.0)
    stop = threading.Event()
    thread = threading.Thread(target=deliverer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        # Each round, the busy tenant's 4 tries hang until the client gives up (1 s); the
        # other tenant's event is read and posted beside them in the first round or two.
        poll(lambda: prompt.received, timeout=4, what="the other tenant's delivery")
        assert prompt.received[0].id == waiting
        assert len(hanging.received) <= 8  # no more than two rounds of the busy tenant's
    finally:
        stop.set()
        released.set()
        thread.join(timeout=10)
        hanging.close()
        prompt.close()
