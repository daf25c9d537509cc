"""A webhook as a submission names it, checked before anything is stored.

The URL's text is checked here (``jobs.core.webhooks.url_problem``, then whether the
deliverer's HTTP client can send to it at all: ``unsendable``) and so is where it points: a
literal address, or every address its name resolves to now, must not be inside a network
(loopback, link-local, private) unless the operator allows it. A name that does not
resolve is accepted (the receiver may not be up yet): the deliverer checks the addresses
again at each try and connects only to an address it checked, so a name that later points
inside is not called either.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import httpx

from jobs.core.errors import InvalidRequest
from jobs.core.webhooks import Webhook, forbidden, literal_address, url_problem
from jobs.process.runtime import Runtime

# An address, and what finds a name's addresses now (none when it does not resolve).
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolve = Callable[[str], Sequence[Address]]

PRIVATE = ("points to a loopback, link-local or private address, which tierq does not call "
           "unless the operator allows it (webhook_allow_private)")


def checked_webhook(
    runtime: Runtime, url: str, events: Sequence[str], *, known: Sequence[str],
    loc: tuple[str | int, ...] = ("webhook",),
) -> Webhook:
    """The subscription, or ``InvalidRequest`` naming the field and why."""
    problem = url_problem(url)
    if problem is not None:
        raise _bad((*loc, "url"), f"must be {problem}")
    refused = unsendable(url)
    if refused is not None:
        raise _bad((*loc, "url"), f"must be a URL an HTTP client can send to ({refused})")
    unknown = [event for event in events if event not in known]
    if unknown:
        raise _bad((*loc, "events"), f"unknown event {unknown[0]!r}: one of {list(known)}")
    if not runtime.settings.webhook_allow_private and points_inside(url):
        raise _bad((*loc, "url"), PRIVATE)
    return Webhook(url=url, events=tuple(dict.fromkeys(events or known[:1])))


def unsendable(url: str) -> str | None:
    """Why the deliverer's HTTP client cannot make a request to ``url`` (None: it can): a
    host that is no IDNA name (``☃.example``), a character no URL may hold. The URL's own
    checks (``url_problem``) pass such URLs; only the client that sends knows."""
    try:
        httpx.Request("POST", url)
    except (httpx.InvalidURL, UnicodeError, ValueError) as exc:
        return str(exc) or type(exc).__name__
    return None


def points_inside(url: str) -> bool:
    """The URL's host is, or resolves to, an address tierq must not call."""
    host = urlsplit(url).hostname or ""
    address = literal_address(host)
    if address is not None:
        return forbidden(address)
    return any(forbidden(found) for found in resolved(host))


def resolved(host: str) -> list[Address]:
    """Every address ``host`` resolves to now (none when it does not): the system's
    resolver, what a ``Resolve`` is unless a test gives another."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [a for a in (literal_address(str(info[4][0]).split("%")[0]) for info in infos)
            if a is not None]


def _bad(loc: tuple[str | int, ...], msg: str) -> InvalidRequest:
    return InvalidRequest(f"{'.'.join(str(part) for part in loc)}: {msg}",
                          details=[{"loc": list(loc), "msg": msg}])
