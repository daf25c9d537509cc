"""Built-in handlers, the registry, and loading extra handlers from a ``module:attr`` spec."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

from jobs.core.domain import Job
from jobs.core.errors import ConfigError, InvalidRequest, UnknownKind
from jobs.core.states import Status
from jobs.execution.running import TIMED_OUT, call_handler
from tests import handlers_for_tests
from workers.handlers import (
    HANDLERS_ENV,
    EchoHandler,
    HandlerRegistry,
    JobCancelled,
    JobContext,
    JobTimedOut,
    LeaseLost,
    RetryableError,
    SleepHandler,
    default_registry,
    load_handlers,
)

pytestmark = pytest.mark.unit


def _ctx() -> JobContext:
    return JobContext(job_id="job-1", attempt=1, tenant_id="tenant-1", kind="sleep")


def _details(exc: pytest.ExceptionInfo[InvalidRequest]) -> list[dict[str, Any]]:
    details: list[dict[str, Any]] = exc.value.details["details"]
    return details


# -- sleep -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"seconds": 0}, {"seconds": 0.0, "fail": False}),
        ({"seconds": 2}, {"seconds": 2.0, "fail": False}),
        ({"seconds": 0.25, "fail": True}, {"seconds": 0.25, "fail": True}),
        ({"seconds": 3600}, {"seconds": 3600.0, "fail": False}),
    ],
)
def test_sleep_accepts_a_number_of_seconds(
    payload: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert default_registry("").validate("sleep", payload) == expected


@pytest.mark.parametrize(
    ("payload", "loc"),
    [
        ({}, ["payload", "seconds"]),
        ({"seconds": -1}, ["payload", "seconds"]),
        ({"seconds": -0.001}, ["payload", "seconds"]),
        ({"seconds": 3600.5}, ["payload", "seconds"]),
        ({"seconds": 10**400}, ["payload", "seconds"]),
        ({"seconds": 1e308}, ["payload", "seconds"]),
        ({"seconds": math.nan}, ["payload", "seconds"]),
        ({"seconds": math.inf}, ["payload", "seconds"]),
        ({"seconds": -math.inf}, ["payload", "seconds"]),
        ({"seconds": True}, ["payload", "seconds"]),
        ({"seconds": False}, ["payload", "seconds"]),
        ({"seconds": "5"}, ["payload", "seconds"]),
        ({"seconds": None}, ["payload", "seconds"]),
        ({"seconds": [1]}, ["payload", "seconds"]),
        ({"seconds": 1, "fail": "yes"}, ["payload", "fail"]),
        ({"seconds": 1, "fail": 1}, ["payload", "fail"]),
        ({"seconds": 1, "second": 2}, ["payload", "second"]),
    ],
)
def test_sleep_rejects_a_bad_payload(payload: dict[str, Any], loc: list[str]) -> None:
    with pytest.raises(InvalidRequest) as exc:
        default_registry("").validate("sleep", payload)
    assert not isinstance(exc.value, UnknownKind)
    assert exc.value.type == "invalid_request"
    details = _details(exc)
    assert [d["loc"] for d in details] == [loc]
    assert all(isinstance(d["msg"], str) and d["msg"] for d in details)


def test_sleep_returns_what_it_slept() -> None:
    assert SleepHandler().run(_ctx(), {"seconds": 0.0, "fail": False}) == {"slept": 0.0}


def test_sleep_with_fail_raises_a_non_retryable_error() -> None:
    with pytest.raises(RuntimeError, match="fail"):
        SleepHandler().run(_ctx(), {"seconds": 0.0, "fail": True})


def test_sleep_stops_when_cancelled() -> None:
    ctx = _ctx()
    timer = threading.Timer(0.05, ctx.mark_cancelled)
    timer.start()
    try:
        with pytest.raises(JobCancelled):
            SleepHandler().run(ctx, {"seconds": 3600.0, "fail": False})
    finally:
        timer.cancel()


def test_sleep_stops_at_its_run_time_limit() -> None:
    ctx = _ctx()
    timer = threading.Timer(0.05, ctx.mark_timed_out)
    timer.start()
    try:
        with pytest.raises(JobTimedOut):
            SleepHandler().run(ctx, {"seconds": 3600.0, "fail": False})
    finally:
        timer.cancel()
    assert ctx.timed_out() and ctx.stopped() and not ctx.cancelled()


def test_sleep_stops_when_the_lease_is_lost() -> None:
    ctx = _ctx()
    ctx.mark_lease_lost()
    with pytest.raises(LeaseLost):
        SleepHandler().run(ctx, {"seconds": 3600.0, "fail": False})


# -- echo ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload", [{}, {"a": 1}, {"nested": {"list": [1, "two", None, True, 2.5]}}]
)
def test_echo_returns_its_payload(payload: dict[str, Any]) -> None:
    registry = default_registry("")
    valid = registry.validate("echo", payload)
    assert valid == payload
    assert EchoHandler().run(_ctx(), valid) == payload


@pytest.mark.parametrize("payload", [[1, 2], "text", 3, None, True])
def test_echo_rejects_a_payload_that_is_not_an_object(payload: Any) -> None:
    with pytest.raises(InvalidRequest) as exc:
        default_registry("").validate("echo", payload)
    assert [d["loc"] for d in _details(exc)] == [["payload"]]


@pytest.mark.parametrize("payload", [{"x": math.nan}, {"x": {1, 2}}, {"x": object()}])
def test_echo_rejects_what_json_cannot_hold(payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        default_registry("").validate("echo", payload)


# -- registry --------------------------------------------------------------------------------


def test_the_built_in_kinds() -> None:
    assert default_registry("", entry_points=False).kinds() == ["echo", "sleep"]


def test_an_unknown_kind_is_an_invalid_request_naming_the_kind() -> None:
    registry = default_registry("")
    with pytest.raises(UnknownKind) as exc:
        registry.validate("transcode", {})
    assert isinstance(exc.value, InvalidRequest)
    assert "transcode" in exc.value.message
    assert [d["loc"] for d in exc.value.details["details"]] == [["kind"]]
    with pytest.raises(UnknownKind):
        registry.get("transcode")


def test_a_kind_is_registered_once_unless_replaced() -> None:
    registry = HandlerRegistry([EchoHandler()])
    with pytest.raises(ValueError, match="echo"):
        registry.register(EchoHandler())
    replacement = EchoHandler()
    registry.register(replacement, replace=True)
    assert registry.get("echo") is replacement


# -- loading extra handlers ------------------------------------------------------------------


def test_a_spec_names_instances_classes_and_lists() -> None:
    spec = "tests.handlers_for_tests:HANDLERS, tests.handlers_for_tests:GateHandler"
    handlers = load_handlers(spec)
    assert [h.kind for h in handlers] == ["record", "flaky", "crash", "gate"]
    assert handlers[0] is handlers_for_tests.HANDLERS[0]
    assert isinstance(handlers[3], handlers_for_tests.GateHandler)


def test_default_registry_adds_the_spec_to_the_built_ins() -> None:
    registry = default_registry("tests.handlers_for_tests:BlockingHandler", entry_points=False)
    assert registry.kinds() == ["block", "echo", "sleep"]


def test_default_registry_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HANDLERS_ENV, "tests.handlers_for_tests:RecordingHandler")
    assert "record" in default_registry().kinds()
    assert "record" not in default_registry("").kinds()
    monkeypatch.delenv(HANDLERS_ENV)
    assert default_registry(entry_points=False).kinds() == ["echo", "sleep"]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_colon", "module:attribute"),
        (":attr", "module:attribute"),
        ("tests.handlers_for_tests:", "module:attribute"),
        ("tests.no_such_module:X", "cannot import"),
        ("tests.handlers_for_tests:NoSuchHandler", "has no 'NoSuchHandler'"),
        ("tests.handlers_for_tests:signal", "no 'kind'"),
        ("jobs.core.states:Status", "cannot build|no 'kind'"),
        ("workers.handlers:SleepHandler", "registered twice"),
    ],
)
def test_a_bad_spec_is_a_config_error(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        default_registry(spec)


# -- run-time limits -------------------------------------------------------------------------


class _Limited(EchoHandler):
    kind = "limited.echo"

    def __init__(self, timeout_s: object = None, retry_on_timeout: bool = False) -> None:
        self.timeout_s = timeout_s
        self.retry_on_timeout = retry_on_timeout


def test_a_kind_may_name_its_own_limit_and_whether_a_timeout_is_retried() -> None:
    registry = HandlerRegistry([SleepHandler(), _Limited(90, retry_on_timeout=True)])
    assert registry.timeout_s("limited.echo") == 90.0
    assert registry.retries_timeout("limited.echo")
    assert registry.timeout_s("sleep") is None and not registry.retries_timeout("sleep")
    assert registry.timeout_s("unknown") is None


@pytest.mark.parametrize("value", [0, -1, 86_401, "60", True, float("nan"), float("inf")])
def test_a_kind_s_limit_out_of_range_stops_the_process_at_start(value: object) -> None:
    with pytest.raises(ConfigError, match="timeout_s"):
        load_handlers_of(_Limited(value))


def load_handlers_of(handler: object) -> None:
    """Load ``handler`` the way ``TIERQ_HANDLERS`` does (its checks included)."""
    from jobs.execution.registry import _as_handler

    _as_handler("tests:handler", handler)


def _job() -> Job:
    return Job(id="job-1", tenant_id="tenant-1", tier="free", kind="returns", payload={},
               status=Status.RUNNING, attempt=1, max_attempts=3, order_key=0.0,
               enqueued_at=0.0, created_at=0.0)


class _Returns(EchoHandler):
    """Returns (or raises ``error``) once the test's ``hook`` has run on the context."""

    kind = "returns"

    def __init__(self, hook: Any, error: Exception | None = None) -> None:
        self.hook, self.error = hook, error

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        self.hook(ctx)
        if self.error is not None:
            raise self.error
        return {"late": True}


@pytest.mark.parametrize("error", [None, RuntimeError("interrupted"), RetryableError("again")])
def test_whatever_a_handler_does_past_its_limit_ends_it_timed_out(
    error: Exception | None,
) -> None:
    registry = HandlerRegistry([_Returns(JobContext.mark_timed_out, error)])
    assert call_handler(registry, _ctx(), _job()).kind == TIMED_OUT


def test_a_cancel_outranks_the_limit() -> None:
    def both(ctx: JobContext) -> None:
        ctx.mark_timed_out()
        ctx.mark_cancelled()

    registry = HandlerRegistry([_Returns(both)])
    assert call_handler(registry, _ctx(), _job()).kind == "cancelled"
