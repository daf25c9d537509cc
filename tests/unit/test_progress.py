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


@given(st.text(alphabet=st.one_of(st.characters(), st.sampled_from("\x00\ud800\udc00")),
               max_size=400))
def test_a_message_holds_only_what_postgresql_stores(message: str) -> None:
    """No U+0000 and no lone surrogate (PostgreSQL refuses both in jsonb): the last report is
    stored with the job's ending, and must never be why its result is refused."""
    text = Report.make(0.5, message, at=0.0, attempt=1).message
    assert text is not None and len(text) <= MAX_MESSAGE
    assert "\x00" not in text
    text.encode("utf-8")  # no lone surrogate


def test_a_nul_is_written_out_and_a_lone_surrogate_replaced() -> None:
    report = Report.make(1.0, "a\x00b\ud800c", at=0.0, attempt=1)
    assert report.message == "a\\x00b\ufffdc"


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
