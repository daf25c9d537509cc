"""The pure request builders of the batch client calls, and the batch estimate."""

from __future__ import annotations

import json

import pytest

from jobs.client.protocol import (
    batch_call,
    batch_results_call,
    cancel_batch_call,
    list_batches_call,
    ndjson,
    submit_batch_call,
)
from jobs.service.batches import _estimate

pytestmark = pytest.mark.unit


def test_a_batch_is_sent_as_ndjson_with_its_kind_and_key_in_the_query() -> None:
    call = submit_batch_call("echo", [{"a": 1}, {"b": [1, 2]}], idempotency_key="k-1",
                             max_attempts=2)
    assert (call.method, call.path, call.content_type) == ("POST", "/v1/batches",
                                                           "application/x-ndjson")
    assert call.params == {"kind": "echo", "idempotency_key": "k-1", "max_attempts": "2"}
    assert call.json is None and call.content is not None
    assert [json.loads(line) for line in call.content.splitlines()] == [{"a": 1},
                                                                        {"b": [1, 2]}]


def test_ndjson_is_one_object_a_line_even_with_newlines_in_text() -> None:
    body = ndjson([{"text": "two\nlines"}, {}])
    assert body.count(b"\n") == 2
    assert [json.loads(line) for line in body.splitlines()] == [{"text": "two\nlines"}, {}]


def test_ids_are_quoted_into_paths() -> None:
    assert batch_call("a/b").path == "/v1/batches/a%2Fb"
    assert batch_results_call("x", after=41).params == {"after": "41"}
    assert batch_results_call("x").path == "/v1/batches/x/results"
    assert cancel_batch_call("x").method == "POST"
    assert list_batches_call(limit=5).params == {"limit": "5"}


@pytest.mark.parametrize(
    ("now", "first_start", "done", "remaining", "expected"),
    [
        (100.0, None, 0, 10, None),  # nothing started: no rate yet
        (100.0, 90.0, 0, 10, None),  # started, nothing finished
        (100.0, 90.0, 20, 10, 5.0),  # 2 items/s so far, 10 left
        (100.0, 90.0, 20, 0, 0.0),  # all done
    ],
)
def test_estimated_finish_is_the_rest_at_the_rate_so_far(
    now: float, first_start: float | None, done: int, remaining: int, expected: float | None
) -> None:
    assert _estimate(now, first_start, done, remaining) == expected
