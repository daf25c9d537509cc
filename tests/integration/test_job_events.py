"""A job's progress and its event stream, on real HTTP, PostgreSQL and Redis.

A handler's reports reach Redis (throttled) and the job's body while it runs, and SQL with
its ending; ``GET /v1/jobs/<id>/events`` sends the job, each change and each report, ends
after the terminal event, and costs no SQL while it waits.
"""

from __future__ import annotations

import asyncio
import resource
import threading
import time
from typing import Any

import httpx
import pytest

from jobs.api.routes import jobs as routes_jobs
from jobs.client.events import Event, parse_events
from jobs.core.progress import Report
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.execution.attempt import execute
from jobs.execution.handlers import JobContext
from jobs.execution.progress import ProgressSender
from jobs.execution.registry import HandlerRegistry
from jobs.index import progress as progress_index
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from tests.integration.api_harness import ApiClient, Clock, Statements, auth, move
from tests.integration.stand_in import stand_ins_for
from tests.integration.test_long_poll import (
    Background,
    RecordingPublisher,
    listener_of,
    roomy_tenant,
    until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


class Stepping:
    """The echo kind, reporting a step at a time: each ``go`` lets one more report out."""

    kind = "echo"

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.go = threading.Semaphore(0)
        self.reported = threading.Semaphore(0)

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        for step in range(1, self.steps + 1):
            assert self.go.acquire(timeout=30), "the test never let the step go"
            ctx.progress(step / self.steps, f"step {step} of {self.steps}")
            self.reported.release()
        return {"steps": self.steps}


class Stream:
    """One event stream (``path``: a job's or a batch's) read in a thread of its own, its
    events kept as they come."""

    def __init__(self, client: ApiClient, key: str, path: str) -> None:
        self.events: list[Event] = []
        self.status: int | None = None
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(client, key, path))
        self._thread.start()

    def _read(self, client: ApiClient, key: str, path: str) -> None:
        timeout = httpx.Timeout(10, read=60)
        with httpx.Client(base_url=str(client.base_url), timeout=timeout) as http, \
                http.stream("GET", path, headers=auth(key)) as answer:
            self.status = answer.status_code
            for event in parse_events(answer.iter_lines()):
                self.events.append(event)
        self.ended.set()

    def names(self) -> list[str]:
        return [event.event for event in self.events]

    def statuses(self) -> list[str]:
        return [e.data["status"] for e in self.events if e.event == "job"]

    def fractions(self) -> list[float]:
        return [e.data["fraction"] for e in self.events if e.event == "progress"]

    def wait_for(self, what: str, count: int = 1) -> None:
        until(lambda: self.names().count(what) >= count, f"{count} {what} event(s)")

    def join(self) -> None:
        assert self.ended.wait(30), "the stream did not end"
        self._thread.join(5)


def test_reports_reach_the_body_and_the_stream_which_ends_with_the_job(
    client: ApiClient, other: Runtime, clock: Clock
) -> None:
    key = client.tenant_key("acme", "premium")
    job_id = client.submit(key, {"kind": "echo", "payload": {}}).json()["id"]
    stream = Stream(client, key, f"/v1/jobs/{job_id}/events")
    stream.wait_for("job")
    assert stream.status == 200 and stream.statuses() == ["queued"]

    assert Dispatcher(other, RecordingPublisher()).run_once(clock.now).dispatched == 1
    handler = Stepping(steps=3)
    worker = Background(lambda: execute(other, HandlerRegistry([handler]), job_id, 1,
                                        worker_id="w1"))
    stream.wait_for("job", 2)  # running
    handler.go.release()
    assert handler.reported.acquire(timeout=20)
    stream.wait_for("progress")
    assert stream.fractions()[0] == pytest.approx(1 / 3)
    body = client.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
    assert body["status"] == "running"
    assert body["progress"]["fraction"] == pytest.approx(1 / 3)
    assert body["progress"]["message"] == "step 1 of 3"
    handler.go.release(2)
    assert worker.join() == "succeeded"
    stream.join()

    assert stream.statuses() == ["queued", "running", "succeeded"]
    fractions = stream.fractions()
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert stream.names()[-1] == "job"  # the terminal event is the last
    final = client.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
    assert final["progress"]["fraction"] == pytest.approx(1.0)
    assert final["progress"]["message"] == "step 3 of 3"
    with other.sessions() as session:
        row = jobs_sql.get_job(session, job_id)
    assert row is not None and row.progress is not None and row.progress["fraction"] == 1.0
    assert len(listener_of(client).waiters) == 0


def test_a_terminal_jobs_stream_is_its_one_event_and_an_unknown_job_is_404(
    client: ApiClient,
) -> None:
    key = client.tenant_key("acme", "premium")
    job_id = client.submit(key).json()["id"]
    move(client, job_id, Status.CANCELLED)
    stream = Stream(client, key, f"/v1/jobs/{job_id}/events")
    stream.join()
    assert stream.statuses() == ["cancelled"]
    missing = client.get("/v1/jobs/00000000-0000-7000-8000-000000000000/events",
                         headers=auth(key))
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"


STREAMS = 1000


def _room_for(descriptors: int) -> None:
    """Raise this process's open-file limit (the server's and the clients' sockets both
    live here) to ``descriptors``, as far as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = descriptors if hard == resource.RLIM_INFINITY else min(descriptors, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    assert hard == resource.RLIM_INFINITY or hard >= descriptors, (
        f"{STREAMS} streams need {descriptors} open files; the hard limit is {hard}")


@pytest.mark.timeout(300)
def test_open_streams_cost_no_sql_while_they_wait(
    client: ApiClient, statements: Statements, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening a thousand streams can take longer than the safety net's period on a loaded
    # machine, and the first would then read SQL in the window (test_long_poll's reason).
    monkeypatch.setattr(routes_jobs, "SAFETY_NET_S", 3600.0)
    _room_for(3 * STREAMS)
    key = roomy_tenant(client)
    jobs = [client.submit(key).json()["id"] for _ in range(3)]
    ends: list[list[str]] = []

    async def streams() -> list[list[str]]:
        limits = httpx.Limits(max_connections=STREAMS + 20, max_keepalive_connections=STREAMS)
        async with httpx.AsyncClient(base_url=str(client.base_url), limits=limits,
                                     timeout=httpx.Timeout(30, read=90)) as http:

            async def one(job_id: str) -> list[str]:
                async with http.stream("GET", f"/v1/jobs/{job_id}/events",
                                       headers=auth(key)) as answer:
                    lines = [line async for line in answer.aiter_lines()]
                return [e.data["status"] for e in parse_events(lines) if e.event == "job"]

            return await asyncio.gather(*(one(jobs[i % 3]) for i in range(STREAMS)))

    sender = threading.Thread(target=lambda: ends.extend(asyncio.run(streams())))
    sender.start()
    listener = listener_of(client)
    until(lambda: len(listener.waiters) == STREAMS and listener.live, "every stream waits",
          timeout_s=180)
    statements.quiet()
    before = statements.count
    time.sleep(2.0)  # the measurement: two seconds of open, quiet streams
    assert statements.count - before == 0
    for job_id in jobs:
        move(client, job_id, Status.CANCELLED)
    sender.join(timeout=180)
    assert len(ends) == STREAMS
    assert {tuple(statuses) for statuses in ends} == {("queued", "cancelled")}
    assert len(listener.waiters) == 0


def test_reports_are_throttled_and_the_last_one_always_lands(
    client: ApiClient, other: Runtime
) -> None:
    sender = ProgressSender(other, "job-x", every_s=0.2)
    for i in range(1, 101):
        sender(Report.make(i / 100, f"{i}", at=time.time(), attempt=1))
    assert sender.sent == 1  # the first goes at once, the rest wait their turn
    sender.close()
    assert sender.sent == 2  # the latest of the rest, not the 99 of them
    found = progress_index.read(other.redis, other.prefix, {"job-x": 1})["job-x"]
    assert (found.fraction, found.message) == (1.0, "100")
    assert progress_index.read(other.redis, other.prefix, {"job-x": 2}) == {}  # not attempt 2


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan"), "half", True])
def test_a_fraction_outside_0_to_1_is_refused(fraction: Any) -> None:
    ctx = JobContext(job_id="j", attempt=1, tenant_id="t", kind="echo")
    with pytest.raises(ValueError, match="fraction"):
        ctx.progress(fraction)
    ctx.progress(0.5, "x" * 500)
    assert ctx.last_report is not None and len(ctx.last_report.message or "") == 200


def test_a_batch_stream_follows_its_counts_and_ends_with_its_last_item(
    client: ApiClient, other: Runtime, clock: Clock
) -> None:
    key = client.tenant_key("bulk", "premium")
    answer = client.post("/v1/batches", headers=auth(key),
                         json={"kind": "echo", "items": [{"n": n} for n in range(3)]})
    assert answer.status_code == 202, answer.text
    batch_id = answer.json()["id"]
    stream = Stream(client, key, f"/v1/batches/{batch_id}/events")
    stream.wait_for("batch")
    assert stream.events[0].data["counts"]["waiting"] == 3

    publisher = RecordingPublisher()
    dispatcher = Dispatcher(other, publisher)
    registry = HandlerRegistry([Stepping(steps=0)])
    deadline = time.monotonic() + 30
    done: set[str] = set()
    while len(done) < 3:  # the feeder lets the items in, the dispatcher sends them, they run
        assert time.monotonic() < deadline, "the items were never run"
        clock.now += 1
        dispatcher.run_once(clock.now)
        for job_id, attempt, _ in publisher.sent:
            if job_id not in done:
                assert execute(other, registry, job_id, attempt, worker_id="w1") == "succeeded"
                done.add(job_id)
    stream.join()
    assert stream.status == 200 and set(stream.names()) == {"batch"}
    last = stream.events[-1].data
    assert last["counts"]["succeeded"] == 3 and last["status"] == "finished"
    waiting = [event.data["counts"]["waiting"] for event in stream.events]
    assert waiting[0] == 3 and waiting[-1] == 0
    assert len(listener_of(client).waiters) == 0


def test_a_stream_whose_job_is_pruned_meanwhile_ends_with_a_typed_error(
    client: ApiClient, other: Runtime
) -> None:
    import sqlalchemy as sa

    from jobs.index import notify
    from jobs.store.models import JobRow

    key = client.tenant_key("acme", "premium")
    job_id = client.submit(key).json()["id"]
    stream = Stream(client, key, f"/v1/jobs/{job_id}/events")
    stream.wait_for("job")
    with other.sessions.begin() as session:  # gone from SQL, as retention would leave it
        session.execute(sa.delete(JobRow).where(JobRow.id == job_id))
    notify.announce(other.redis, other.prefix, [job_id])
    stream.join()
    assert stream.names() == ["job", "error"]
    assert stream.events[-1].data["type"] == "not_found"
    assert len(listener_of(client).waiters) == 0
