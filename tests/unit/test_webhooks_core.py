"""The pure parts of webhooks: which URLs and addresses a subscription may name, how events
are stored on a row, and the backoff between tries."""

from __future__ import annotations

import ipaddress
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core.text import storable_text
from jobs.core.webhooks import (
    BATCH_EVENTS,
    FIRST_BACKOFF_S,
    JOB_EVENTS,
    MAX_BACKOFF_S,
    Reach,
    Webhook,
    backoff_s,
    events_column,
    events_of,
    forbidden,
    url_problem,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("url", ["https://example.com/hook", "http://example.com:8080/a?b=c",
                                 "https://[2606:4700::1111]/x"])
def test_a_callable_url_has_no_problem(url: str) -> None:
    assert url_problem(url) is None


@pytest.mark.parametrize(("url", "says"), [
    ("ftp://example.com/", "http or https"), ("example.com/hook", "http or https"),
    ("https:///path", "with a host"), ("https://u:p@example.com/", "without credentials"),
    ("https://example.com:0/", "port"), ("https://example.com:99999/", "not a URL"),
    ("https://example.com/" + "a" * 2000, "at most 2000"),
])
def test_a_url_that_cannot_be_called_says_why(url: str, says: str) -> None:
    assert says in (url_problem(url) or "")


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "100.64.0.1",
    "0.0.0.0", "224.0.0.1", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "255.255.255.255",
])
def test_addresses_inside_a_network_are_forbidden(address: str) -> None:
    assert forbidden(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["1.1.1.1", "8.8.8.8", "2606:4700::1111",
                                     "::ffff:8.8.8.8"])
def test_public_addresses_are_not(address: str) -> None:
    assert not forbidden(ipaddress.ip_address(address))


def test_the_operator_may_open_one_network_and_no_more() -> None:
    reach = Reach(networks=(ipaddress.ip_network("127.0.0.2/32"),
                            ipaddress.ip_network("fd00:1::/64")))
    assert not reach.refuses(ipaddress.ip_address("127.0.0.2"))
    assert not reach.refuses(ipaddress.ip_address("::ffff:127.0.0.2"))  # the same, mapped
    assert not reach.refuses(ipaddress.ip_address("fd00:1::5"))
    assert not reach.refuses(ipaddress.ip_address("8.8.8.8"))
    for inside in ("127.0.0.1", "127.0.0.3", "10.0.0.1", "fd00:2::5", "169.254.169.254"):
        assert reach.refuses(ipaddress.ip_address(inside)), inside
    assert not Reach(allow_private=True).refuses(ipaddress.ip_address("127.0.0.1"))
    assert Reach().refuses(ipaddress.ip_address("127.0.0.2"))


@given(st.lists(st.sampled_from(JOB_EVENTS + BATCH_EVENTS + ("batch.completed",))))
def test_events_survive_their_column(events: list[str]) -> None:
    column = events_column(tuple(events))
    assert set(events_of(column)) == set(events)
    for event in events:  # the trigger's test: one LIKE per event, never a false match
        assert f",{event}," in column
    if "completed" not in events:
        assert ",completed," not in column


def test_a_batch_item_carries_what_its_batch_asked_for() -> None:
    url = "https://example.com/"
    assert Webhook.of_batch(url, ("completed",)).events == ("batch.completed",)
    assert Webhook.of_batch(url, ("item.completed",)).events == ("item.completed",)
    assert set(Webhook.of_batch(url, BATCH_EVENTS).events) == {"item.completed",
                                                                "batch.completed"}


@given(st.integers(min_value=1, max_value=60), st.integers(min_value=0, max_value=2**32))
def test_backoff_doubles_within_its_bounds(tries: int, seed: int) -> None:
    wait = backoff_s(tries, random.Random(seed))
    base = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (tries - 1))
    assert 0.8 * base <= wait <= 1.2 * base


@given(st.text())
def test_an_error_is_kept_as_postgresql_can_store_it(text: str) -> None:
    kept = storable_text(text, 300)
    assert "\x00" not in kept and len(kept) <= 300
    kept.encode("utf-8")  # no lone surrogate
    if text.isascii() and "\x00" not in text:
        assert kept == text[:300]
