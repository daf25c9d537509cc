"""Long-polls wake on a notification of their job's change and cost SQL nothing meanwhile.

Real HTTP, PostgreSQL and Redis. The changes come from a second runtime (another process's
connections: its own engine and Redis client) through the real dispatcher, worker and cancel
code, or by hand through the repository with the notification sent or withheld.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from jobs.api.routes import jobs as routes_jobs
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.execution.attempt import execute
from jobs.execution.handlers import JobContext
from jobs.execution.registry import HandlerRegistry
from jobs.index import notify
from jobs.index.notify import Listener
from jobs.process.runtime import Runtime
from jobs.service import jobs as job_service
from jobs.service import tenants
from tests.integration.api_harness import ADMIN_KEY, ApiClient, Clock, Statements, auth, move, rt
from tests.integration.stand_in import stand_ins_for

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


# An answer within half the safety net's period of the change was woken by its notification:
# the safety net (SAFETY_NET_S, 10 s and more) would come later, however loaded the machine.
PROMPT_S = routes_jobs.SAFETY_NET_S / 2


class Reads:
    """The job reads the API has finished (``load_job`` returned), counted: a poll's first
    read done is when a change made after it is one the poll must answer for. A change made
    between the waiter's registration and that read is the status it starts from."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._lock = threading.Lock()
        real = job_service.load_job

        def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                return real(*args, **kwargs)
            finally:
                with self._lock:
                    self.count += 1

        monkeypatch.setattr(job_service, "load_job", counted)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    return Reads(monkeypatch)


class Poll:
    """One long-poll sent from a thread of its own."""

    def __init__(self, client: ApiClient, key: str, job_id: str, wait: float,
                 reads: Reads) -> None:
        self.response: httpx.Response | None = None
        self.answered_at = 0.0
        self._client = client
        self._reads = reads
        self._read_before = reads.count
        self._thread = threading.Thread(target=self._run, args=(client, key, job_id, wait))
        self._thread.start()

    def waiting(self) -> None:
        """Until this poll waits, has read the status it waits to see change, and the
        listener is subscribed."""
        waiting(self._client, 1)
        until(lambda: self._reads.count > self._read_before, "the poll's first read")

    def _run(self, client: ApiClient, key: str, job_id: str, wait: float) -> None:
        self.response = client.get(f"/v1/jobs/{job_id}", params={"wait": wait},
                                   headers=auth(key))
        self.answered_at = time.monotonic()

    def status(self) -> str:
        self._thread.join(timeout=90)
        assert self.response is not None and self.response.status_code == 200
        status: str = self.response.json()["status"]
        return status


def roomy_tenant(client: ApiClient) -> str:
    """A tenant that may queue several jobs at once (standard tier: room in its bound)."""
    tenant = client.create_tenant("acme", "standard")
    patched = client.patch(f"/v1/admin/tenants/{tenant['id']}", json={"max_queued": 10},
                           headers=auth(ADMIN_KEY))
    assert patched.status_code == 200, patched.text
    key: str = tenant["api_key"]
    return key


def listener_of(client: ApiClient) -> Listener:
    listener: Listener = client.app.state.listener
    return listener


def until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def waiting(client: ApiClient, n: int) -> None:
    """Until ``n`` long-polls wait and the listener is subscribed."""
    listener = listener_of(client)
    until(lambda: len(listener.waiters) == n and listener.live, f"{n} waiters, listening")


class Background:
    """A call run in a thread of its own, its return value kept."""

    def __init__(self, call: Callable[[], str]) -> None:
        self._result: list[str] = []
        self._thread = threading.Thread(target=lambda: self._result.append(call()))
        self._thread.start()

    def join(self) -> str:
        self._thread.join(timeout=90)
        assert self._result, "the call did not return"
        return self._result[0]


class RecordingPublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, str]] = []

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        self.sent.append((job_id, attempt, tier))


# -- woken by the change ----------------------------------------------------------------------


class GatedEcho:
    """The echo kind, held in its handler until the test opens the gate: the worker's start
    is seen on its own, before the job ends."""

    kind = "echo"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        self.entered.set()
        assert self.gate.wait(60), "the gate was never opened"
        return payload


def test_start_end_and_cancel_elsewhere_answer_at_once(
    client: ApiClient, other: Runtime, clock: Clock, reads: Reads
) -> None:
    """A dispatch changes nothing a client sees (the row stays queued): the poll waits on,
    and is answered by the worker's start (announced with the renewal that follows it), then
    by the job's end and by a cancel, each as soon as it happens."""
    key = client.tenant_key("acme", "premium")
    job_id = client.submit(key, {"kind": "echo", "payload": {"x": 1}}).json()["id"]

    poll = Poll(client, key, job_id, wait=30, reads=reads)
    poll.waiting()
    publisher = RecordingPublisher()
    assert Dispatcher(other, publisher).run_once(clock.now).dispatched == 1
    assert publisher.sent == [(job_id, 1, "premium")]
    handler = GatedEcho()
    registry = HandlerRegistry([handler])
    changed_at = time.monotonic()
    worker = Background(lambda: execute(other, registry, job_id, 1, worker_id="w1"))
    try:
        # The first change the poll hears of is the start: the dispatch did not end it.
        assert poll.status() == "running"
        assert poll.answered_at - changed_at < PROMPT_S
        assert handler.entered.wait(20)

        poll = Poll(client, key, job_id, wait=30, reads=reads)
        poll.waiting()
        changed_at = time.monotonic()
    finally:
        handler.gate.set()
    assert worker.join() == "succeeded"
    assert poll.status() == "succeeded"
    assert poll.answered_at - changed_at < PROMPT_S

    second = client.submit(key).json()["id"]
    poll = Poll(client, key, second, wait=30, reads=reads)
    poll.waiting()
    changed_at = time.monotonic()
    tenant = tenants.tenant_for_key(other, key)
    assert tenant is not None
    assert job_service.cancel(other, tenant, second).job.status is Status.CANCELLED
    assert poll.status() == "cancelled"
    assert poll.answered_at - changed_at < PROMPT_S


def test_another_jobs_news_does_not_end_the_wait(
    client: ApiClient, other: Runtime, reads: Reads
) -> None:
    key = roomy_tenant(client)
    mine, theirs = client.submit(key).json()["id"], client.submit(key).json()["id"]
    poll = Poll(client, key, mine, wait=1.5, reads=reads)
    poll.waiting()
    started = time.monotonic()
    move(client, theirs, Status.CANCELLED)
    # A notification of this job with nothing changed: one read, and the wait goes on.
    notify.announce(other.redis, other.settings.key_prefix, [mine])
    assert poll.status() == "queued"
    assert poll.answered_at - started >= 1.3


# -- what waiting costs -------------------------------------------------------------------------

WAITERS = 1000
# The longest wait a poll may ask (MAX_LONG_POLL_S): one not woken by the change would only
# end then, however long a loaded machine took to open the thousand of them.
WAIT_S = 60


def test_a_thousand_waiting_polls_cost_no_sql(
    client: ApiClient, statements: Statements, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening a thousand polls can take longer than the safety net's period on a loaded
    # machine, and the first would then read SQL in the window: that read is its own test's.
    monkeypatch.setattr(routes_jobs, "SAFETY_NET_S", 3600.0)
    key = roomy_tenant(client)
    jobs = [client.submit(key).json()["id"] for _ in range(4)]
    answers: list[httpx.Response] = []

    async def polls() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=WAITERS + 50, max_keepalive_connections=WAITERS)
        async with httpx.AsyncClient(base_url=str(client.base_url), limits=limits,
                                     timeout=90) as http:
            return await asyncio.gather(*(
                http.get(f"/v1/jobs/{jobs[i % 4]}", params={"wait": WAIT_S}, headers=auth(key))
                for i in range(WAITERS)))

    sender = threading.Thread(target=lambda: answers.extend(asyncio.run(polls())))
    started = time.monotonic()
    sender.start()
    waiting(client, WAITERS)
    statements.quiet()
    before = statements.count
    time.sleep(2.0)  # the measurement: two seconds of a thousand waits
    assert statements.count - before == 0
    for job_id in jobs:
        move(client, job_id, Status.CANCELLED)
    sender.join(timeout=WAIT_S + 30)
    # Woken by the change, not by their own wait running out (however slow the machine)
    assert time.monotonic() - started < WAIT_S
    assert len(answers) == WAITERS
    assert {answer.json()["status"] for answer in answers} == {"cancelled"}
    assert len(listener_of(client).waiters) == 0


def test_a_client_that_leaves_stops_waiting(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    job_id = client.submit(key).json()["id"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{client.base_url}/v1/jobs/{job_id}", params={"wait": 30},
                  headers=auth(key), timeout=0.5)
    until(lambda: len(listener_of(client).waiters) == 0, "the waiter is gone", timeout_s=5)


# -- lost notifications -------------------------------------------------------------------------


def kill_listener(client: ApiClient, admin: redis.Redis) -> None:
    """Cut this app's subscriber connection (found by its name; no other client touched)."""
    name = listener_of(client).client_name
    ids = [entry["id"] for entry in admin.client_list(_type="pubsub")
           if entry.get("name") == name]
    assert len(ids) == 1
    admin.client_kill_filter(_id=ids[0])


def test_a_dropped_subscription_wakes_the_waiters(
    client: ApiClient, redis_client: redis.Redis, reads: Reads
) -> None:
    key = client.tenant_key("acme")
    job_id = client.submit(key).json()["id"]
    poll = Poll(client, key, job_id, wait=30, reads=reads)
    poll.waiting()
    dispatch_one_quietly(client, job_id)  # its notification is lost
    changed_at = time.monotonic()
    kill_listener(client, redis_client)
    assert poll.status() == "dispatched"
    assert poll.answered_at - changed_at < PROMPT_S
    # Subscribed again, the next change is heard as before.
    poll = Poll(client, key, job_id, wait=30, reads=reads)
    poll.waiting()
    changed_at = time.monotonic()
    move(client, job_id, Status.CANCELLED)
    assert poll.status() == "cancelled"
    assert poll.answered_at - changed_at < PROMPT_S


def test_the_safety_net_finds_a_lost_notification(
    client: ApiClient, monkeypatch: pytest.MonkeyPatch, reads: Reads
) -> None:
    monkeypatch.setattr(routes_jobs, "SAFETY_NET_S", 0.5)
    key = client.tenant_key("acme")
    job_id = client.submit(key).json()["id"]
    poll = Poll(client, key, job_id, wait=30, reads=reads)
    poll.waiting()
    changed_at = time.monotonic()
    move(client, job_id, Status.CANCELLED, announce=False)
    assert poll.status() == "cancelled"
    assert poll.answered_at - changed_at < 0.75 + PROMPT_S


def dispatch_one_quietly(client: ApiClient, job_id: str) -> None:
    runtime = rt(client)
    leases = runtime.index.dispatch(1, now=runtime.clock(), lease_ttl_s=30)
    assert [lease.job_id for lease in leases] == [job_id]
    move(client, job_id, Status.DISPATCHED, announce=False)

