"""LeanScript answers as redis-py's Script does, and survives what Script survives: a server
that forgot its scripts, a connection cut between calls. On a Redis of the test's own (a
SCRIPT FLUSH would reach every other test's scripts on a shared one)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.connection import AbstractConnection

from jobs.index.lean_script import LeanScript, one_trip
from tests.faults.servers import ThrowawayRedis

pytestmark = pytest.mark.integration

ECHO = "return {KEYS, ARGV}"
KEYS = ["{t}:a", "{t}:b"]


def test_a_call_sends_what_redis_pys_script_sends(fault_redis: ThrowawayRedis) -> None:
    client = fault_redis.client()
    lean = LeanScript(client, ECHO, KEYS)
    args = ["text", "ünïcode", 7, 0.1, -2.5e-300, b"\x00raw", ""]
    assert lean(keys=KEYS, args=args) == lean.script(keys=KEYS, args=args)
    assert lean(keys=KEYS, args=args) == [[b"{t}:a", b"{t}:b"], [
        b"text", "ünïcode".encode(), b"7", b"0.1", b"-2.5e-300", b"\x00raw", b""]]
    # Keys after the fixed ones are passed on; other keys go through redis-py's path.
    assert lean(keys=[*KEYS, "{t}:c"], args=["x"]) == [[b"{t}:a", b"{t}:b", b"{t}:c"], [b"x"]]
    assert lean(keys=["{t}:z"], args=[]) == [[b"{t}:z"], []]
    with pytest.raises(redis.DataError):
        lean(keys=KEYS, args=[None])  # type: ignore[list-item]


def test_a_pipelines_call_is_queued_in_the_pipeline(fault_redis: ThrowawayRedis) -> None:
    client = fault_redis.client()
    lean = LeanScript(client, ECHO, KEYS)
    lean(keys=KEYS, args=["loaded"])
    pipe = client.pipeline(transaction=False)
    lean(keys=KEYS, args=["1"], client=pipe)
    lean(keys=KEYS, args=["2"], client=pipe)
    assert [reply[1] for reply in pipe.execute()] == [[b"1"], [b"2"]]


def test_a_script_error_is_raised_as_redis_raises_it(fault_redis: ThrowawayRedis) -> None:
    lean = LeanScript(fault_redis.client(), "return redis.error_reply('NOPE no')", KEYS)
    with pytest.raises(redis.ResponseError, match="NOPE no"):
        lean(keys=KEYS, args=[])


def test_a_server_that_forgot_its_scripts_is_given_them_again(
    fault_redis: ThrowawayRedis,
) -> None:
    client = fault_redis.client()
    lean = LeanScript(client, ECHO, KEYS)
    assert lean(keys=KEYS, args=["before"])[1] == [b"before"]
    client.script_flush()
    assert lean(keys=KEYS, args=["after"])[1] == [b"after"]
    assert client.script_exists(lean.script.sha) == [True]


# -- one_trip: two scripts' calls in one round trip ----------------------------------------

FAIL = "return redis.error_reply('NOPE ' .. ARGV[1])"


def test_two_calls_in_one_trip_are_answered_in_order(fault_redis: ThrowawayRedis) -> None:
    client = fault_redis.client()
    first, second = LeanScript(client, ECHO, KEYS), LeanScript(client, ECHO, KEYS[:1])
    replies = one_trip((first, KEYS, ["1"]), (second, [*KEYS[:1], "{t}:c"], ["2"]))
    assert replies == ([[b"{t}:a", b"{t}:b"], [b"1"]], [[b"{t}:a", b"{t}:c"], [b"2"]])
    # The connection is left clean: the next call reads its own reply.
    assert first(keys=KEYS, args=["3"])[1] == [b"3"]
    with pytest.raises(ValueError, match="own keys"):
        one_trip((first, ["{t}:z"], []), (second, KEYS[:1], []))


def test_an_error_reply_in_one_trip_keeps_the_other_answer(
    fault_redis: ThrowawayRedis,
) -> None:
    client = fault_redis.client()
    echo, fail = LeanScript(client, ECHO, KEYS), LeanScript(client, FAIL, KEYS)
    failed, answered = one_trip((fail, KEYS, ["first"]), (echo, KEYS, ["kept"]))
    assert isinstance(failed, redis.ResponseError) and "NOPE first" in str(failed)
    assert answered[1] == [b"kept"]
    answered, failed = one_trip((echo, KEYS, ["kept"]), (fail, KEYS, ["second"]))
    assert answered[1] == [b"kept"] and isinstance(failed, redis.ResponseError)
    assert echo(keys=KEYS, args=["after"])[1] == [b"after"]


def test_a_trip_to_a_server_that_forgot_its_scripts_sends_each_again_once(
    fault_redis: ThrowawayRedis,
) -> None:
    client = fault_redis.client()
    counter = LeanScript(client, "return redis.call('INCR', KEYS[1])", KEYS)
    echo = LeanScript(client, ECHO, KEYS)
    assert one_trip((counter, KEYS, []), (echo, KEYS, ["x"]))[0] == 1
    client.script_flush()
    assert one_trip((counter, KEYS, []), (echo, KEYS, ["y"])) == (
        2, [[b"{t}:a", b"{t}:b"], [b"y"]])
    assert client.get(KEYS[0]) == b"2"  # each ran once, however it was sent
    assert client.script_exists(counter.script.sha, echo.script.sha) == [True, True]


def test_a_connection_cut_between_calls_is_replaced(fault_redis: ThrowawayRedis) -> None:
    client = fault_redis.client()
    lean = LeanScript(client, ECHO, KEYS)
    assert lean(keys=KEYS, args=["before"])[1] == [b"before"]
    other = fault_redis.client()
    try:
        # The pool's connections: the one that ran the script, the one that loaded it.
        assert other.client_kill_filter(_type="normal", skipme=True) >= 1
        assert lean(keys=KEYS, args=["after"])[1] == [b"after"]
    finally:
        other.close()


def test_a_call_cut_off_before_its_reply_leaves_no_reply_for_the_next(
    fault_redis: ThrowawayRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = fault_redis.client()
    lean = LeanScript(client, ECHO, KEYS)
    lean(keys=KEYS, args=["loaded"])
    read = AbstractConnection.read_response
    cut = [True]

    def once_interrupted(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        if cut.pop() if cut else False:
            raise KeyboardInterrupt  # after the send: the reply is on its way
        return read(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "read_response", once_interrupted)
    with pytest.raises(KeyboardInterrupt):
        lean(keys=KEYS, args=["first"])
    assert lean(keys=KEYS, args=["second"])[1] == [b"second"]


def test_a_server_that_is_gone_is_an_error_not_a_hang(fault_redis: ThrowawayRedis) -> None:
    client = fault_redis.client()
    lean = LeanScript(client, ECHO, KEYS)
    lean(keys=KEYS, args=[])
    fault_redis.stop()
    with pytest.raises(redis.ConnectionError):
        lean(keys=KEYS, args=[])
