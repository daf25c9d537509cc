"""Run the API over real HTTP for tests: uvicorn in a thread, on a free port of 127.0.0.1.

``serve(app)`` yields the base URL and stops the server afterwards. ``ApiClient`` is an
``httpx.Client`` with helpers for the admin routes and tenant keys. ``running_api`` builds the
app on its own runtime (optionally on a hand-moved ``Clock``); ``move`` and ``dispatch_one``
drive a job as the dispatcher and a worker would, for states the API cannot reach alone.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI

from jobs.api.app import create_app
from jobs.api.http_protocol import CoalescingProtocol
from jobs.core.states import Status
from jobs.execution.attempt import start_figures
from jobs.index import notify
from jobs.index.base import Renewal
from jobs.process.runtime import Runtime
from jobs.process.settings import Settings, load_settings
from jobs.store import jobs as jobs_sql

ADMIN_KEY = "integration-admin-key"


@contextlib.contextmanager
def serve(app: FastAPI) -> Iterator[tuple[str, uvicorn.Server]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", ws="none",
                            http=CoalescingProtocol)  # as ``tierq api`` serves
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class ApiClient(httpx.Client):
    """An HTTP client of the test server, with helpers for tenants."""

    runtime: Any = None  # the server's runtime, for tests that drive state behind the API
    server: uvicorn.Server | None = None

    def in_flight(self) -> set[Any]:
        """The server's request tasks now (pass to ``wait_for_new_request``)."""
        assert self.server is not None
        return set(self.server.server_state.tasks)

    def wait_for_new_request(self, before: set[Any]) -> None:
        """Block until the server handles a request that was not in ``before`` (polling
        with a deadline): e.g. a long-poll sent from another thread is now under way."""
        assert self.server is not None
        tasks = self.server.server_state.tasks
        deadline = time.monotonic() + 20
        while not set(tasks) - before:
            assert time.monotonic() < deadline, "the request never reached the server"
            time.sleep(0.005)

    @property
    def app(self) -> FastAPI:
        """The served app (its state holds the listener and the tenant cache)."""
        assert self.server is not None
        app: FastAPI = self.server.config.app
        return app

    def create_tenant(self, name: str, tier: str = "free") -> dict[str, Any]:
        response = self.post(
            "/v1/admin/tenants", json={"name": name, "tier": tier}, headers=auth(ADMIN_KEY)
        )
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    def tenant_key(self, name: str, tier: str = "free") -> str:
        key: str = self.create_tenant(name, tier)["api_key"]
        return key

    def submit(self, key: str, body: dict[str, Any] | None = None) -> httpx.Response:
        payload = body if body is not None else {"kind": "sleep", "payload": {"seconds": 1}}
        return self.post("/v1/jobs", json=payload, headers=auth(key))


@contextlib.contextmanager
def api_client(app: FastAPI) -> Iterator[ApiClient]:
    with serve(app) as (url, server), ApiClient(base_url=url, timeout=90) as client:
        client.server = server
        yield client


class Clock:
    """A clock the test moves by hand (the API reads time only through the runtime)."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


def make_settings(db_url: str, redis_url: str, key_prefix: str, **policy: Any) -> Settings:
    return load_settings(
        database_url=db_url,
        redis_url=redis_url,
        key_prefix=key_prefix,
        admin_key=ADMIN_KEY,
        # Three tests run at once against one server of 100 connections: a burst of a
        # thousand requests in each must not take 50 apiece (its threads wait their turn).
        database_pool_size=8,
        policy={"pool_concurrency": 4, **policy},
    )


@contextlib.contextmanager
def running_api(settings: Settings, clock: Clock | None = None) -> Iterator[ApiClient]:
    runtime = Runtime.from_settings(settings)
    if clock is not None:
        runtime.clock = clock
    try:
        with api_client(create_app(settings, runtime)) as client:
            client.runtime = runtime
            yield client
    finally:
        runtime.close()


def rt(client: ApiClient) -> Runtime:
    runtime: Runtime = client.runtime
    return runtime


def move(
    client: ApiClient, job_id: str, *steps: Status, announce: bool = True, **fields: Any
) -> None:
    """Walk a job through ``steps`` (a CAS each); ``fields`` go with the last step. Then
    announce the change, as the dispatcher and the workers do (``announce=False``: a lost
    notification)."""
    runtime = rt(client)
    with runtime.sessions.begin() as session:
        job = jobs_sql.get_job(session, job_id)
        assert job is not None
        for step in steps:
            extra = fields if step is steps[-1] else {}
            assert jobs_sql.transition(
                session, job_id, src=job.status, attempt=job.attempt, dst=step,
                now=runtime.clock(), **extra,
            )
            job = jobs_sql.get_job(session, job_id)
            assert job is not None
    if announce:
        notify.announce(runtime.redis, runtime.settings.key_prefix, [job_id])


def dispatch_one(client: ApiClient, job_id: str) -> None:
    """Lease the next job, which must be ``job_id``, and mark it dispatched."""
    leases = rt(client).index.dispatch(1, now=rt(client).clock(), lease_ttl_s=30)
    assert [lease.job_id for lease in leases] == [job_id]
    move(client, job_id, Status.DISPATCHED)


def start_one(client: ApiClient, job_id: str) -> None:
    """Move a dispatched job to running and record its start as a worker does: the renewal
    that announces it carries its queue wait and dispatch latency (``jobs.index.counters``)."""
    move(client, job_id, Status.RUNNING)
    runtime = rt(client)
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None
    renewal = runtime.index.renew_checked(
        job_id, attempt=job.attempt, ttl_s=30, now=runtime.clock(), announce=True,
        start=start_figures(job),
    )
    assert renewal is not Renewal.LOST


def queue_of(client: ApiClient, key: str, tier: str) -> dict[str, Any]:
    """The tier's entry of ``/v1/queues``."""
    tiers = client.get("/v1/queues", headers=auth(key)).json()["tiers"]
    found: dict[str, Any] = next(entry for entry in tiers if entry["name"] == tier)
    return found


class Statements:
    """SQL statements run by an engine, counted as they start."""

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        self._engine = engine
        sa.event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *_: Any) -> None:
        self.count += 1

    def quiet(self) -> None:
        """Until no statement has run for half a second (reads under way finish)."""
        deadline = time.monotonic() + 20
        while True:
            before = self.count
            time.sleep(0.5)
            if self.count == before:
                return
            assert time.monotonic() < deadline, "SQL never went quiet"

    def close(self) -> None:
        sa.event.remove(self._engine, "before_cursor_execute", self._seen)
