"""The deliverer against real receivers on loopback (what is read and recorded on SQLite
and PostgreSQL, the HTTP side on one of them): one tenant's backlog at a receiver that
hangs holds up no other tenant's delivery; a name that resolves
outside to the check and inside afterwards (DNS rebinding) gets no request inside, while
TLS still checks the URL's name, and a try through an egress proxy still has its name
checked; an answer that never ends, trickles or is huge costs a try its deadline and a few
KiB at most; and a try that fails in any way is recorded, so no event is claimed again and
again without a trace.

The events are written into the outbox as the trigger of migration 0013 writes them (its
own tests are in ``test_webhook_outbox.py``); what a delivery carries comes from a render
of the test's (the deliverer's own seam), since these events' jobs are not stored.
"""

from __future__ import annotations

import ipaddress
import ssl
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
from tests.webhook_receiver import CA, Answers, ForwardProxy, Receiver

pytestmark = pytest.mark.integration


def runtime_of(db_url: str, redis_server: RedisServer, key_prefix: str, *,
               allow_private: bool) -> Runtime:
    settings = make_settings(db_url, redis_server.url, key_prefix).model_copy(
        update={"webhook_allow_private": allow_private})
    return Runtime.from_settings(settings)


@pytest.fixture
def runtime(
    db_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[Runtime]:
    """A dispatcher's connections; loopback receivers allowed (``webhook_allow_private``)."""
    made = runtime_of(db_url, redis_server, key_prefix, allow_private=True)
    yield made
    made.close()


@pytest.fixture
def receiving(
    sqlite_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[Runtime]:
    """The same on one database: what these tests look at is HTTP, not SQL."""
    made = runtime_of(sqlite_url, redis_server, key_prefix, allow_private=True)
    yield made
    made.close()


@pytest.fixture
def guarded(
    sqlite_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[Runtime]:
    """A dispatcher's connections as deployed: no address inside a network is called."""
    made = runtime_of(sqlite_url, redis_server, key_prefix, allow_private=False)
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


# A global address (``forbidden`` says no): what a rebinding name answers its check with.
OUTSIDE = ipaddress.ip_address("1.2.3.4")
LOOPBACK = ipaddress.ip_address("127.0.0.1")


class Rebinding:
    """A DNS answer that changes under the deliverer: outside first, loopback afterwards,
    as a name whose records have a zero TTL and an owner who switches them."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, host: str) -> list[Any]:
        self.asked.append(host)
        return [OUTSIDE if len(self.asked) == 1 else LOOPBACK]


def attempts(runtime: Runtime, event_id: str) -> tuple[str, list[repo.Attempt]]:
    with runtime.sessions() as session:
        status = session.execute(sa.select(repo.EVENTS.c.status)
                                 .where(repo.EVENTS.c.id == event_id)).scalar_one()
        tries = session.execute(sa.select(repo.ATTEMPTS).where(
            repo.ATTEMPTS.c.event_id == event_id).order_by(repo.ATTEMPTS.c.id)).all()
    return status, [repo.Attempt(at=0, status_code=row.status_code, error=row.error,
                                 duration_ms=row.duration_ms) for row in tries]


def due_again(runtime: Runtime, event_id: str) -> None:
    """Skip the backoff: the event is due now."""
    with runtime.sessions.begin() as session:
        session.execute(sa.update(repo.EVENTS).where(repo.EVENTS.c.id == event_id)
                        .values(next_attempt_at=dt(runtime.clock() - 1)))


def test_a_name_that_rebinds_to_loopback_after_its_check_gets_no_request_there(
    guarded: Runtime,
) -> None:
    receiver = Receiver(0, lambda got, tries: 204)
    # ``localhost``: a name the system would resolve to the receiver, had the deliverer
    # asked it rather than its own resolver.
    url = f"http://localhost:{receiver.port}/hook"
    (event_id,) = record(guarded, tenant(guarded, "acme"), url, 1, due_at=guarded.clock() - 1)
    resolver = Rebinding()
    deliverer = Deliverer(guarded, render, resolve=resolver, timeout_s=1.0)
    try:
        assert deliverer.run_once() == 1  # checked outside: its connection goes there only
        reached = [got.id for got in receiver.received]
        assert reached == [], "a try checked outside reached the loopback receiver"
        due_again(guarded, event_id)
        assert deliverer.run_once() == 1  # resolved inside: refused, no connection
    finally:
        receiver.close()
    assert receiver.received == []
    assert resolver.asked == ["localhost", "localhost"]  # once per try
    status, (first, second) = attempts(guarded, event_id)
    assert first.status_code is None and first.error and "loopback" not in first.error
    assert second.error is not None and "loopback, link-local or private" in second.error
    assert status == "failed"  # it can never succeed: not tried again


def test_an_allowed_network_is_called_and_a_name_turning_elsewhere_inside_is_not(
    sqlite_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any,
) -> None:
    settings = make_settings(sqlite_url, redis_server.url, key_prefix).model_copy(
        update={"webhook_allow_networks": [ipaddress.ip_network("127.0.0.2/32")]})
    runtime = Runtime.from_settings(settings)
    allowed = Receiver(0, lambda got, tries: 204, host="127.0.0.2")
    other = Receiver(0, lambda got, tries: 204)  # 127.0.0.1: inside, not allowed
    acme = tenant(runtime, "acme")
    (to_allowed,) = record(runtime, acme, allowed.url_at("allowed.test"), 1,
                           due_at=runtime.clock() - 1)
    (to_other,) = record(runtime, acme, other.url_at("turned.test"), 1,
                         due_at=runtime.clock() - 1)
    names = Names(allowed_test=[ipaddress.ip_address("127.0.0.2")],
                  turned_test=[ipaddress.ip_address("127.0.0.1")])
    deliverer = Deliverer(runtime, render, resolve=names, timeout_s=1.0)
    try:
        assert deliverer.run_once() == 2
        assert [got.id for got in allowed.received] == [to_allowed]
        assert other.received == []
        assert attempts(runtime, to_allowed)[0] == "delivered"
        status, (refused,) = attempts(runtime, to_other)
        assert status == "failed" and "loopback, link-local or private" in (refused.error or "")
    finally:
        allowed.close()
        other.close()
        runtime.close()


class Names:
    """A resolver that knows a few names, each with its addresses."""

    def __init__(self, **names: Any) -> None:
        self.names = {name.replace("_", "."): found for name, found in names.items()}

    def __call__(self, host: str) -> list[Any]:
        return list(self.names.get(host, []))


def test_tls_checks_the_certificate_against_the_urls_name_not_the_address(
    receiving: Runtime,
) -> None:
    runtime = receiving
    receiver = Receiver(0, lambda got, tries: 204, tls=True)
    owner = tenant(runtime, "acme")
    now = runtime.clock()
    (right,) = record(runtime, owner, receiver.url_at("receiver.test"), 1, due_at=now - 2)
    (wrong,) = record(runtime, owner, receiver.url_at("other.test"), 1, due_at=now - 1)
    deliverer = Deliverer(runtime, render, timeout_s=2.0,
                          resolve=Names(receiver_test=[LOOPBACK], other_test=[LOOPBACK]),
                          ssl_context=ssl.create_default_context(cafile=CA))
    try:
        assert deliverer.run_once() == 2
    finally:
        receiver.close()
    assert [got.id for got in receiver.received] == [right]
    assert attempts(runtime, right)[0] == "delivered"
    status, (refused,) = attempts(runtime, wrong)
    assert status == "pending" and refused.status_code is None
    assert refused.error is not None and "certificate" in refused.error.lower()


def test_a_try_through_an_egress_proxy_has_its_name_checked_first(
    guarded: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver(0, lambda got, tries: 204)
    proxy = ForwardProxy()
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    for name in ("NO_PROXY", "no_proxy", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    owner = tenant(guarded, "acme")
    now = guarded.clock()
    (outside,) = record(guarded, owner, receiver.url_at("receiver.test"), 1, due_at=now - 2)
    (inside,) = record(guarded, owner, receiver.url_at("inside.test"), 1, due_at=now - 1)
    deliverer = Deliverer(guarded, render, timeout_s=2.0,
                          resolve=Names(receiver_test=[OUTSIDE], inside_test=[LOOPBACK]))
    try:
        assert deliverer.run_once() == 2
    finally:
        proxy.close()
        receiver.close()
    # The proxy (the operator's, on loopback) is used; the name inside is never sent to it.
    assert proxy.asked == [f"http://receiver.test:{receiver.port}/hook"]
    assert [got.id for got in receiver.received] == [outside]
    status, (refused,) = attempts(guarded, inside)
    assert status == "failed" and refused.error is not None and "loopback" in refused.error


DEADLINE_S = 1.0


@pytest.mark.parametrize("kind", ["endless", "trickled_headers", "trickled_error"])
def test_an_answer_that_never_ends_costs_the_try_its_deadline_and_no_more(
    receiving: Runtime, kind: str
) -> None:
    runtime = receiving
    ended = threading.Event()
    answers = Answers(ended)
    receiver = Receiver(0, lambda got, tries: 204, reply=getattr(answers, kind))
    (event_id,) = record(runtime, tenant(runtime, "acme"), receiver.url, 1,
                         due_at=runtime.clock() - 1)
    deliverer = Deliverer(runtime, render, timeout_s=DEADLINE_S)
    trying = threading.Thread(target=deliverer.run_once, daemon=True)
    trying.start()
    try:
        trying.join(timeout=DEADLINE_S + 3)
        assert not trying.is_alive(), f"the try outlived its {DEADLINE_S} s deadline"
    finally:
        ended.set()  # the answer ends, so an unbounded try ends too
        trying.join(timeout=10)
        receiver.close()
    status, (attempt,) = attempts(runtime, event_id)
    if kind == "endless":  # a 2xx delivers at once: its body is not read
        assert (status, attempt.status_code, attempt.error) == ("delivered", 200, None)
        return
    assert status == "pending" and attempt.error is not None
    if kind == "trickled_error":  # what came in time is kept, and no more than that
        assert attempt.status_code == 503 and attempt.error.startswith("HTTP 503: bbb")
    else:
        assert attempt.status_code is None and "Timeout" in attempt.error


def test_a_name_whose_lookup_never_ends_costs_the_try_its_deadline(receiving: Runtime) -> None:
    released = threading.Event()

    def never(host: str) -> list[Any]:
        released.wait(30)
        return []

    (event_id,) = record(receiving, tenant(receiving, "acme"), "http://hangs.example/hook", 1,
                         due_at=receiving.clock() - 1)
    deliverer = Deliverer(receiving, render, timeout_s=DEADLINE_S, resolve=never)
    trying = threading.Thread(target=deliverer.run_once, daemon=True)
    trying.start()
    try:
        trying.join(timeout=DEADLINE_S + 3)
        assert not trying.is_alive(), f"the try outlived its {DEADLINE_S} s deadline"
    finally:
        released.set()
    status, (attempt,) = attempts(receiving, event_id)
    assert status == "pending" and attempt.error is not None
    assert attempt.error.startswith("ConnectTimeout: the lookup of 'hangs.example'")


def test_a_huge_answer_is_read_a_few_kib_into(receiving: Runtime) -> None:
    runtime = receiving
    ended = threading.Event()
    answers = Answers(ended)
    receiver = Receiver(0, lambda got, tries: 204, reply=answers.huge_error)
    (event_id,) = record(runtime, tenant(runtime, "acme"), receiver.url, 1,
                         due_at=runtime.clock() - 1)
    try:
        assert Deliverer(runtime, render, timeout_s=5.0).run_once() == 1
        # The client closed its connection after a few KiB: the receiver could not send
        # the rest (what it did send lies in the two sockets' buffers, a few MiB at most).
        assert answers.finished.wait(5), "the receiver is still sending"
        assert answers.sent < 24 * 2**20, f"{answers.sent} bytes of a 48 MiB answer taken"
    finally:
        ended.set()
        receiver.close()
    status, (attempt,) = attempts(runtime, event_id)
    assert status == "pending" and attempt.status_code == 500
    assert attempt.error is not None and attempt.error.startswith("HTTP 500: zzz")


def test_a_try_that_fails_in_any_way_is_recorded(runtime: Runtime) -> None:
    """A URL no request can be made to (stored before submits refused it), a delivery whose
    body cannot be made, an answer PostgreSQL cannot store as it came (a U+0000): each try
    is recorded, given up on when no later try can succeed, else tried again later."""
    receiver = Receiver(0, lambda got, tries: 204, reply=lambda out: out.write(
        b"HTTP/1.0 500 Internal Server Error\r\n\r\nbad\x00byte"))
    owner = tenant(runtime, "acme")
    now = runtime.clock()
    (unsendable,) = record(runtime, owner, "https://\u2603.receiver.example/hook", 1,
                           due_at=now - 3)
    (unrendered,) = record(runtime, owner, receiver.url, 1, due_at=now - 2)
    (nul,) = record(runtime, owner, receiver.url, 1, due_at=now - 1)
    with runtime.sessions() as session:
        broken = session.execute(sa.select(repo.EVENTS.c.job_id).where(
            repo.EVENTS.c.id == unrendered)).scalar_one()

    def rendering(event: Event) -> dict[str, Any]:
        if event.job_id == broken:
            raise KeyError("result")
        return render(event)

    deliverer = Deliverer(runtime, rendering, timeout_s=2.0)
    try:
        assert deliverer.run_once() == 3
    finally:
        receiver.close()
    recorded = {event_id: attempts(runtime, event_id) for event_id in (unsendable, unrendered,
                                                                        nul)}
    unrecorded = [event_id for event_id, (_, tries) in recorded.items() if not tries]
    assert unrecorded == [], f"{len(unrecorded)} of 3 tries left no record"
    status, (attempt,) = recorded[unsendable]
    assert status == "failed" and attempt.error is not None
    assert attempt.error.startswith("the URL cannot be sent")
    status, (attempt,) = recorded[unrendered]
    assert status == "pending" and attempt.error == "KeyError: 'result'"
    status, (attempt,) = recorded[nul]
    assert status == "pending" and attempt.status_code == 500
    assert attempt.error == "HTTP 500: bad\\x00byte"
