"""A ``text/event-stream`` of the API (``GET /v1/jobs/{id}/events``, ``.../batches/{id}/
events``) read as events, a line at a time, by both clients."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event of a job's stream: ``job`` (``data``: the job's body) or
    ``progress`` (``data``: ``fraction``, ``message``, ``at``)."""

    event: str
    data: Any


class EventParser:
    """A ``text/event-stream`` read a line at a time: ``feed`` answers the event a blank
    line completes (comments skipped; a data field that is not JSON is kept as text)."""

    def __init__(self) -> None:
        self._name, self._data = "message", list[str]()

    def feed(self, line: str) -> Event | None:
        if line == "":
            name, data = self._name, self._data
            self._name, self._data = "message", []
            if not data:
                return None
            text = "\n".join(data)
            try:
                value: Any = json.loads(text)
            except ValueError:
                value = text
            return Event(event=name, data=value)
        if not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                self._name = value
            elif field == "data":
                self._data.append(value)
        return None


def parse_events(lines: Iterable[str]) -> Iterator[Event]:
    """The events of a ``text/event-stream``, as its lines arrive."""
    parser = EventParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event
