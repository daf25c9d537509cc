"""Webhooks: which events a subscription names, how they are stored on a row, which
addresses tierq may call, and how long a delivery is retried.

A subscription is stored on the job's row as its URL and its events as ``,a,b,`` (a batch's
items carry their batch's: ``item.completed`` and ``batch.completed``), so the database's
trigger that records an event in the transaction of the change (migration 0013) tests it
with one ``LIKE`` in either dialect.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass
from urllib.parse import urlsplit

# What a job's and a batch's subscription may name; the default is the first.
JOB_EVENTS = ("completed", "started")
BATCH_EVENTS = ("completed", "item.completed")
# The type of each event as a receiver sees it.
JOB_STARTED, JOB_COMPLETED = "job.started", "job.completed"
BATCH_COMPLETED, BATCH_ITEM_COMPLETED = "batch.completed", "batch.item.completed"
# What a batch item's row carries for its batch's subscription.
ITEM_MARK, BATCH_MARK = "item.completed", "batch.completed"

MAX_URL_LENGTH = 2000
# A receiver has this long to answer; a delivery is retried for this long after its event.
TIMEOUT_S = 10.0
RETRY_FOR_S = 24 * 3600.0
# Backoff between tries: doubling from the first, at most the last, jittered by a fifth.
FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 3600.0


@dataclass(frozen=True, kw_only=True)
class Webhook:
    """A subscription: where to POST, and the events it wants."""

    url: str
    events: tuple[str, ...]

    @property
    def column(self) -> str:
        return events_column(self.events)

    @classmethod
    def of_batch(cls, url: str, events: tuple[str, ...]) -> Webhook:
        """What each item of a batch with this subscription carries on its row."""
        marks = [ITEM_MARK] if ITEM_MARK in events else []
        marks += [BATCH_MARK] if "completed" in events else []
        return cls(url=url, events=tuple(marks))


def events_column(events: tuple[str, ...]) -> str:
    return "," + ",".join(sorted(set(events))) + ","


def events_of(column: str | None) -> tuple[str, ...]:
    return tuple(part for part in (column or "").split(",") if part)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be called (None: it can, as far as its text goes)."""
    if len(url) > MAX_URL_LENGTH:
        return f"a URL of at most {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https"):
        return "an http or https URL"
    if not parts.hostname:
        return "a URL with a host"
    if parts.username is not None or parts.password is not None:
        return "a URL without credentials in it (sign with the tenant's secret instead)"
    if port == 0:
        return "a URL with a port from 1 to 65535"
    return None


def literal_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def forbidden(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """An address inside someone's network: loopback, link-local (cloud metadata),
    private, shared, reserved, multicast or unspecified. Unless the operator allows them, a
    tenant must not make tierq call there."""
    address = _unmapped(address)
    return not address.is_global or address.is_multicast


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, kw_only=True)
class Reach:
    """Where webhooks may go: every global address; inside a network only where the
    operator says, either anywhere (``allow_private``, a deployment whose tenants are all
    trusted) or in the ``networks`` it names (one receiver's subnet, the rest still
    refused)."""

    allow_private: bool = False
    networks: tuple[Network, ...] = ()

    def refuses(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        if self.allow_private:
            return False
        address = _unmapped(address)
        return forbidden(address) and not any(address in network for network in self.networks)


def _unmapped(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def backoff_s(tries: int, rng: random.Random | None = None) -> float:
    """The wait after the ``tries``-th failed try (1 for the first)."""
    base = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2.0 ** max(0, tries - 1))
    return base * (0.8 + 0.4 * (rng or random.Random()).random())
