"""Progress reports and the event stream's wire form (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jobs.client.events import Event, parse_events
from jobs.core.progress import MAX_MESSAGE, Report


@given(st.floats(0, 1), st.one_of(st.none(), st.text(max_size=400)),
       st.floats(0, 4e9), st.integers(1, 100))
def test_a_report_survives_its_stored_form(
    fraction: float, message: str | None, at: float, attempt: int
) -> None:
    report = Report.make(fraction, message, at=at, attempt=attempt)
    assert Report.from_dict(report.to_dict()) == report
    assert report.message is None or len(report.message) <= MAX_MESSAGE


def test_anything_else_stored_reads_as_no_report() -> None:
    for stored in (None, [], {"fraction": "x"}, {"at": 1.0}, "text"):
        assert Report.from_dict(stored) is None


def test_events_are_parsed_as_they_arrive_comments_skipped() -> None:
    lines = [": ping - 2026-12-03", "", "event: job", 'data: {"status": "queued"}', "",
             "event: progress", 'data: {"fraction": 0.5,', 'data:  "message": "half"}', "",
             "data: plain text", ""]
    assert list(parse_events(lines)) == [
        Event(event="job", data={"status": "queued"}),
        Event(event="progress", data={"fraction": 0.5, "message": "half"}),
        Event(event="message", data="plain text"),
    ]
