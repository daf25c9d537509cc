"""A handed-over message is what the broker would have delivered: its payload, read without
decoding, is its body decoded; and each message's payload is its own."""

from __future__ import annotations

import json

from celery import Celery

from workers.handover import InProcess


def test_the_payload_is_the_body_decoded_and_each_messages_own() -> None:
    deliver = InProcess(Celery("t", broker="memory://"), "tierq.run_job", "q")
    first = deliver._message(["job-1", 2, 1_700_000_000.25, "token"])
    second = deliver._message(["job-2", 1, 1_700_000_001.5, "other"])

    assert first.payload == json.loads(first.body)
    assert first.payload == [["job-1", 2, 1_700_000_000.25, "token"], {},
                             {"callbacks": None, "errbacks": None, "chain": None,
                              "chord": None}]
    assert second.payload == json.loads(second.body)
    first.payload[2]["chain"] = ["changed"]
    assert second.payload[2]["chain"] is None
    assert deliver._message(["job-3", 1, 1.0, "t"]).payload[2]["chain"] is None
    assert first.headers["id"] != second.headers["id"]
