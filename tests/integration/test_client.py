"""The HTTP client against a real HTTP server (uvicorn) that answers from a script."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jobs.client.http import (
    ApiError,
    AsyncClient,
    Client,
    NotFound,
    Refused,
    RetryPolicy,
    Unauthorized,
    Unavailable,
    Unreachable,
)

pytestmark = pytest.mark.integration

JOB_ID = "0190b3a0-0000-7000-8000-000000000001"
ACCEPTED = {"id": JOB_ID, "status": "queued", "tier": "free", "queue_position": 3,
            "estimated_wait_s": 1.5, "links": {"self": f"/v1/jobs/{JOB_ID}"}}
# Retries in these tests wait whatever the server's Retry-After says, without jitter.
POLICY = RetryPolicy(attempts=5, total_s=60.0, max_delay_s=5.0, jitter=0.0, backoff_s=0.05)


def refusal(type_: str, *, retry_after: int = 1, position: int = 240) -> Response:
    body = {"error": {"type": type_, "message": f"refused: {type_}.",
                      "retry_after_seconds": retry_after}}
    headers = {"Retry-After": str(retry_after), "X-Queue-Position": str(position),
               "X-Tier": "free"}
    return JSONResponse(body, status_code=429, headers=headers)


def error(status: int, type_: str, **headers: str) -> Response:
    body = {"error": {"type": type_, "message": f"{type_} happened."}}
    return JSONResponse(body, status_code=status, headers=headers)


def job(status: str, **extra: Any) -> Response:
    return JSONResponse({"id": JOB_ID, "kind": "echo", "tier": "free", "status": status,
                         "attempt": 1, **extra})


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    at: float = field(default_factory=time.monotonic)


@dataclass
class ScriptedApi:
    """Answers each request with the next scripted response for its route."""

    script: dict[str, deque[Response]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def answer(self, route: str, *responses: Response) -> None:
        self.script.setdefault(route, deque()).extend(responses)

    def requests(self, route: str) -> list[Seen]:
        return [s for s in self.seen if f"{s.method} {s.path}" == route]

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        route = f"{request.method} {request.url.path}"
        self.seen.append(Seen(request.method, request.url.path, dict(request.query_params),
                              dict(request.headers), json.loads(raw) if raw else None))
        queue = self.script.get(route)
        if not queue:
            return error(500, "unscripted")
        return queue.popleft()

    def app(self) -> Starlette:
        paths = ["/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/result",
                 "/v1/jobs/{job_id}/cancel", "/v1/queues"]
        return Starlette(routes=[Route(p, self.handle, methods=["GET", "POST"]) for p in paths])


@pytest.fixture
def api() -> ScriptedApi:
    return ScriptedApi()


@pytest.fixture
def base_url(api: ScriptedApi) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(api.app(), log_level="warning", lifespan="off", ws="none",
                            http="h11")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture
def client(base_url: str) -> Iterator[Client]:
    with Client(base_url, "tenant-key", retry=POLICY) as c:
        yield c


def test_submit_sends_the_job_with_the_key(api: ScriptedApi, client: Client) -> None:
    api.answer("POST /v1/jobs", JSONResponse(ACCEPTED, status_code=202))
    accepted = client.submit("echo", {"a": 1}, max_wait_s=30, max_attempts=2)
    assert accepted == ACCEPTED
    (request,) = api.requests("POST /v1/jobs")
    assert request.headers["authorization"] == "Bearer tenant-key"
    assert request.body["kind"] == "echo"
    assert request.body["payload"] == {"a": 1}
    assert request.body["max_wait_s"] == 30
    assert request.body["max_attempts"] == 2
    assert request.body["idempotency_key"]  # a fresh one: retries cannot duplicate the job


def test_capacity_refusals_are_retried_after_retry_after(
    api: ScriptedApi, client: Client
) -> None:
    api.answer("POST /v1/jobs", refusal("capacity"), refusal("capacity"),
               JSONResponse(ACCEPTED, status_code=202))
    assert client.submit("echo", {"a": 1}, idempotency_key="k-1") == ACCEPTED
    sent = api.requests("POST /v1/jobs")
    assert len(sent) == 3
    assert {s.body["idempotency_key"] for s in sent} == {"k-1"}


def test_capacity_refusals_give_up_after_the_attempts(api: ScriptedApi, base_url: str) -> None:
    policy = RetryPolicy(attempts=3, total_s=60.0, max_delay_s=0.05, jitter=0.0)
    api.answer("POST /v1/jobs", *(refusal("capacity") for _ in range(5)))
    with Client(base_url, "k", retry=policy) as client, pytest.raises(Refused) as caught:
        client.submit("echo", {})
    assert caught.value.type == "capacity"
    assert len(api.requests("POST /v1/jobs")) == 3


def test_a_tenant_limit_is_never_retried(api: ScriptedApi, client: Client) -> None:
    api.answer("POST /v1/jobs", refusal("tenant_limit", retry_after=7, position=9),
               JSONResponse(ACCEPTED, status_code=202))
    with pytest.raises(Refused) as caught:
        client.submit("echo", {"a": 1})
    refused = caught.value
    assert (refused.status, refused.type, refused.tier) == (429, "tenant_limit", "free")
    assert refused.retry_after_s == 7
    assert refused.queue_position == 9
    assert refused.message == "refused: tenant_limit."
    assert len(api.requests("POST /v1/jobs")) == 1


def test_unavailable_is_retried(api: ScriptedApi, client: Client) -> None:
    api.answer("POST /v1/jobs", error(503, "unavailable", **{"Retry-After": "1"}),
               JSONResponse(ACCEPTED, status_code=202))
    assert client.submit("echo", {})["id"] == JOB_ID
    assert len(api.requests("POST /v1/jobs")) == 2


def test_wait_long_polls_until_the_job_is_terminal(api: ScriptedApi, client: Client) -> None:
    path = f"GET /v1/jobs/{JOB_ID}"
    api.answer(path, job("queued", queue_position=2), job("running"), job("succeeded"))
    updates: list[str] = []
    final = client.wait(JOB_ID, on_update=lambda j: updates.append(j["status"]))
    assert final["status"] == "succeeded"
    assert updates == ["queued", "running", "succeeded"]
    assert [s.query for s in api.requests(path)] == [{"wait": "30"}] * 3


def test_wait_gives_up_at_its_timeout(api: ScriptedApi, client: Client) -> None:
    api.answer(f"GET /v1/jobs/{JOB_ID}", *(job("queued") for _ in range(50)))
    with pytest.raises(TimeoutError):
        client.wait(JOB_ID, timeout=0.5)


def test_result_cancel_and_queues(api: ScriptedApi, client: Client) -> None:
    api.answer(f"GET /v1/jobs/{JOB_ID}/result",
               JSONResponse({"id": JOB_ID, "status": "running"}, status_code=202,
                            headers={"Retry-After": "1"}),
               JSONResponse({"id": JOB_ID, "status": "succeeded", "result": {"a": 1}}))
    api.answer(f"POST /v1/jobs/{JOB_ID}/cancel",
               JSONResponse({"id": JOB_ID, "status": "cancelled"}))
    api.answer("GET /v1/queues", JSONResponse({"tiers": [], "pool": {"capacity": 2}}))
    assert client.result(JOB_ID)["status"] == "running"
    assert client.result(JOB_ID)["result"] == {"a": 1}
    assert client.cancel(JOB_ID)["status"] == "cancelled"
    assert client.queues()["pool"] == {"capacity": 2}


@pytest.mark.parametrize(
    ("status", "type_", "expected"),
    [(404, "not_found", NotFound), (401, "unauthorized", Unauthorized),
     (409, "job_failed", ApiError), (503, "unavailable", Unavailable)],
)
def test_errors_are_typed(
    api: ScriptedApi, base_url: str, status: int, type_: str, expected: type[ApiError]
) -> None:
    api.answer(f"GET /v1/jobs/{JOB_ID}", error(status, type_))
    with Client(base_url, "k", retry=RetryPolicy(attempts=1)) as client:
        with pytest.raises(expected) as caught:
            client.get(JOB_ID)
    assert type(caught.value) is expected
    assert (caught.value.status, caught.value.type) == (status, type_)
    assert caught.value.message == f"{type_} happened."


class CountingTransport(httpx.HTTPTransport):
    """The real transport, counting the requests it was asked to send."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return super().handle_request(request)


def test_connection_errors_are_retried_then_reported() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    policy = RetryPolicy(attempts=3, backoff_s=0.01, jitter=0.0)
    transport = CountingTransport()
    try:
        with Client(url, "k", retry=policy, transport=transport) as client:
            with pytest.raises(Unreachable) as caught:
                client.submit("echo", {})
        assert caught.value.status == 0
        assert transport.sent == 3
    finally:
        sock.close()


def cli(base_url: str, *args: str) -> Any:
    from typer.testing import CliRunner

    from jobs.cli.main import build_app

    env = {"TIERQ_API_URL": base_url, "TIERQ_API_KEY": "tenant-key", "COLUMNS": "200"}
    return CliRunner().invoke(build_app(), list(args), env=env)


def test_cli_submit_wait_prints_the_result(api: ScriptedApi, base_url: str) -> None:
    api.answer("POST /v1/jobs", JSONResponse(ACCEPTED, status_code=202))
    api.answer(f"GET /v1/jobs/{JOB_ID}", job("running"), job("succeeded"))
    api.answer(f"GET /v1/jobs/{JOB_ID}/result",
               JSONResponse({"id": JOB_ID, "status": "succeeded", "result": {"a": 1}}))
    result = cli(base_url, "submit", "echo", "--payload", '{"a": 1}', "--wait")
    assert result.exit_code == 0, result.output
    assert f"job {JOB_ID}  tier free  position 3" in result.stdout
    assert json.loads(result.stdout[result.stdout.index("{"):]) == {"a": 1}


def test_cli_submit_wait_exits_1_when_the_job_fails(api: ScriptedApi, base_url: str) -> None:
    api.answer("POST /v1/jobs", JSONResponse(ACCEPTED, status_code=202))
    api.answer(f"GET /v1/jobs/{JOB_ID}", job("failed", error="RuntimeError: boom"))
    result = cli(base_url, "submit", "sleep", "--payload", '{"seconds": 1}', "--wait")
    assert result.exit_code == 1
    assert "failed: RuntimeError: boom" in result.stderr


def test_cli_submit_refused_exits_2_with_retry_after(api: ScriptedApi, base_url: str) -> None:
    api.answer("POST /v1/jobs", refusal("tenant_limit", retry_after=7))
    result = cli(base_url, "submit", "echo")
    assert result.exit_code == 2
    assert "refused (tenant_limit): refused: tenant_limit. Retry after 7 s." in result.stderr
    assert len(api.requests("POST /v1/jobs")) == 1


def test_cli_status_prints_the_job(api: ScriptedApi, base_url: str) -> None:
    api.answer(f"GET /v1/jobs/{JOB_ID}", job("queued", queue_position=4))
    result = cli(base_url, "status", JOB_ID)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["queue_position"] == 4


# -- AsyncClient: the same contract over asyncio ----------------------------------------------

T = TypeVar("T")


def run_async(
    base_url: str,
    body: Callable[[AsyncClient], Awaitable[T]],
    *,
    policy: RetryPolicy = POLICY,
    transport: httpx.AsyncBaseTransport | None = None,
) -> T:
    async def main() -> T:
        async with AsyncClient(base_url, "tenant-key", retry=policy,
                               transport=transport) as client:
            return await body(client)

    return asyncio.run(main())


def test_async_submit_retries_capacity_after_retry_after(
    api: ScriptedApi, base_url: str
) -> None:
    api.answer("POST /v1/jobs", refusal("capacity", retry_after=1),
               refusal("capacity", retry_after=1), JSONResponse(ACCEPTED, status_code=202))
    accepted = run_async(base_url, lambda c: c.submit("echo", {"a": 1}, max_wait_s=30))
    assert accepted == ACCEPTED
    sent = api.requests("POST /v1/jobs")
    assert len(sent) == 3
    assert len({s.body["idempotency_key"] for s in sent}) == 1  # one job, however many tries
    assert sent[0].headers["authorization"] == "Bearer tenant-key"
    assert sent[0].body["max_wait_s"] == 30
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(sent)]
    assert min(gaps) >= 1.0  # each retry waited out the server's Retry-After


def test_async_capacity_refusals_give_up_after_the_attempts(
    api: ScriptedApi, base_url: str
) -> None:
    policy = RetryPolicy(attempts=3, total_s=60.0, max_delay_s=0.05, jitter=0.0)
    api.answer("POST /v1/jobs", *(refusal("capacity") for _ in range(5)))
    with pytest.raises(Refused) as caught:
        run_async(base_url, lambda c: c.submit("echo", {}), policy=policy)
    assert caught.value.type == "capacity"
    assert len(api.requests("POST /v1/jobs")) == 3


def test_async_tenant_limit_raises_at_once_with_the_message(
    api: ScriptedApi, base_url: str
) -> None:
    api.answer("POST /v1/jobs", refusal("tenant_limit", retry_after=7, position=9),
               JSONResponse(ACCEPTED, status_code=202))
    with pytest.raises(Refused) as caught:
        run_async(base_url, lambda c: c.submit("echo", {"a": 1}))
    refused = caught.value
    assert (refused.status, refused.type, refused.tier) == (429, "tenant_limit", "free")
    assert (refused.retry_after_s, refused.queue_position) == (7, 9)
    assert refused.message == "refused: tenant_limit."
    assert len(api.requests("POST /v1/jobs")) == 1


def test_async_unavailable_is_retried(api: ScriptedApi, base_url: str) -> None:
    api.answer("POST /v1/jobs", error(503, "unavailable", **{"Retry-After": "1"}),
               JSONResponse(ACCEPTED, status_code=202))
    assert run_async(base_url, lambda c: c.submit("echo", {}))["id"] == JOB_ID
    first, second = api.requests("POST /v1/jobs")
    assert second.at - first.at >= 1.0


def test_async_wait_long_polls_until_the_job_is_terminal(
    api: ScriptedApi, base_url: str
) -> None:
    path = f"GET /v1/jobs/{JOB_ID}"
    api.answer(path, job("queued", queue_position=2), job("running"), job("succeeded"))
    updates: list[str] = []
    final = run_async(
        base_url, lambda c: c.wait(JOB_ID, on_update=lambda j: updates.append(j["status"]))
    )
    assert final["status"] == "succeeded"
    assert updates == ["queued", "running", "succeeded"]
    assert [s.query for s in api.requests(path)] == [{"wait": "30"}] * 3


def test_async_wait_gives_up_at_its_timeout(api: ScriptedApi, base_url: str) -> None:
    api.answer(f"GET /v1/jobs/{JOB_ID}", *(job("queued") for _ in range(50)))
    with pytest.raises(TimeoutError):
        run_async(base_url, lambda c: c.wait(JOB_ID, timeout=0.5))
    first = api.requests(f"GET /v1/jobs/{JOB_ID}")[0]
    assert first.query == {"wait": "1"}  # the hold never outlasts the client's own timeout


def test_async_result_cancel_and_queues(api: ScriptedApi, base_url: str) -> None:
    api.answer(f"GET /v1/jobs/{JOB_ID}/result",
               JSONResponse({"id": JOB_ID, "status": "succeeded", "result": {"a": 1}}))
    api.answer(f"POST /v1/jobs/{JOB_ID}/cancel",
               JSONResponse({"id": JOB_ID, "status": "cancelled"}))
    api.answer("GET /v1/queues", JSONResponse({"tiers": [], "pool": {"capacity": 2}}))

    async def calls(client: AsyncClient) -> tuple[Any, ...]:
        return ((await client.result(JOB_ID))["result"], (await client.cancel(JOB_ID))["status"],
                (await client.queues())["pool"])

    assert run_async(base_url, calls) == ({"a": 1}, "cancelled", {"capacity": 2})


def test_async_errors_are_typed(api: ScriptedApi, base_url: str) -> None:
    api.answer(f"GET /v1/jobs/{JOB_ID}", error(404, "not_found"))
    with pytest.raises(NotFound) as caught:
        run_async(base_url, lambda c: c.get(JOB_ID), policy=RetryPolicy(attempts=1))
    assert caught.value.message == "not_found happened."


class AsyncCountingTransport(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return await super().handle_async_request(request)


def test_async_connection_errors_are_retried_then_reported() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    transport = AsyncCountingTransport()
    try:
        with pytest.raises(Unreachable):
            run_async(url, lambda c: c.submit("echo", {}), transport=transport,
                      policy=RetryPolicy(attempts=3, backoff_s=0.01, jitter=0.0))
        assert transport.sent == 3
    finally:
        sock.close()


def test_cli_submit_says_each_refusal_it_waits_out(api: ScriptedApi, base_url: str) -> None:
    api.answer("POST /v1/jobs", refusal("capacity", retry_after=1), JSONResponse(
        ACCEPTED, status_code=202))
    result = cli(base_url, "submit", "echo")
    assert result.exit_code == 0, result.output
    assert "capacity: refused: capacity; trying again in" in result.stderr
    assert "(try 2 of 5)" in result.stderr
    assert len(api.requests("POST /v1/jobs")) == 2


def test_cli_submit_reads_the_payload_from_a_file_and_takes_max_attempts(
    api: ScriptedApi, base_url: str, tmp_path: Any
) -> None:
    api.answer("POST /v1/jobs", JSONResponse(ACCEPTED, status_code=202))
    path = tmp_path / "payload.json"
    path.write_text('{"pairs": [["a", "b"]], "labels": [1.0]}')
    result = cli(base_url, "submit", "eval.similarity", "--payload", f"@{path}",
                 "--max-attempts", "2")
    assert result.exit_code == 0, result.output
    sent = api.requests("POST /v1/jobs")[0].body
    assert sent["payload"] == {"pairs": [["a", "b"]], "labels": [1.0]}
    assert sent["max_attempts"] == 2
    missing = cli(base_url, "submit", "echo", "--payload", "@/no/such/file.json")
    assert missing.exit_code == 2 and "cannot read /no/such/file.json" in missing.stderr
