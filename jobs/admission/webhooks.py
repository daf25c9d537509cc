"""A webhook as a submission names it, checked before anything is stored.

The URL's text is checked here (``jobs.core.webhooks.url_problem``, then whether the
deliverer's HTTP client can send to it at all: ``unsendable``) and so is where it points: a
literal address, or every address its name resolves to now, must not be inside a network
(loopback, link-local, private) unless the operator allows it. A name that does not
resolve is accepted (the receiver may not be up yet): the deliverer checks the addresses
again at each try and connects only to an address it checked, so a name that later points
inside is not called either. That is also why a lookup may be cut short: ``getaddrinfo``
has no timeout, and the API's threads are every tenant's, so a submit waits ``LOOKUP_S``
at most for its name and a tenant has ``LOOKUPS_PER_TENANT`` lookups under way at most
(``Lookups``); a name past either bound is taken as one that does not resolve now.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections import Counter
from collections.abc import Callable, Sequence

import httpx

from jobs.core.errors import InvalidRequest
from jobs.core.webhooks import Reach, Webhook, literal_address, url_problem
from jobs.process.runtime import Runtime

# A submit's lookup of its webhook's name: how long it may take, how many of one tenant's
# may be under way in a process, and how many in all.
LOOKUP_S = 2.0
LOOKUPS_PER_TENANT = 2
LOOKUP_THREADS = 16

# An address, and what finds a name's addresses now (none when it does not resolve).
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolve = Callable[[str], Sequence[Address]]

PRIVATE = ("points to a loopback, link-local or private address, which tierq does not call "
           "unless the operator allows it (webhook_allow_private, webhook_allow_networks)")


def checked_webhook(
    runtime: Runtime, url: str, events: Sequence[str], *, known: Sequence[str], tenant: str,
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
    reach = runtime.settings.webhook_reach()
    if not reach.allow_private and points_inside(url, tenant=tenant, reach=reach):
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


def points_inside(url: str, *, tenant: str, reach: Reach) -> bool:
    """The URL's host is, or resolves to, an address ``reach`` refuses. A name whose
    lookup takes longer than ``LOOKUP_S``, or that the tenant names while
    ``LOOKUPS_PER_TENANT`` lookups of its own are still under way, is taken as one that does
    not resolve now: accepted, as the deliverer looks it up at every try and connects only
    to an address it checked."""
    host = httpx.URL(url).raw_host.decode("ascii")
    address = literal_address(host)
    if address is not None:
        return reach.refuses(address)
    return any(reach.refuses(found) for found in lookups().addresses(host, owner=tenant) or ())


def resolved(host: str) -> list[Address]:
    """Every address ``host`` resolves to now (none when it does not): the system's
    resolver, what a ``Resolve`` is unless a test gives another."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [a for a in (literal_address(str(info[4][0]).split("%")[0]) for info in infos)
            if a is not None]


class Lookups:
    """Name lookups bounded in time and in what one owner may hold. ``getaddrinfo`` takes
    no timeout and cannot be interrupted, so each lookup runs on a thread of its own (a
    daemon: one that never returns keeps no process from ending) and its caller waits for
    it ``timeout_s`` at most. At most ``threads`` run at once, ``per_tenant`` of one
    owner's, counted until they return, not until their callers stop waiting: a name whose
    DNS never answers holds its owner's share, and no more, for as long as the system's
    resolver takes to give up. A lookup that times out or finds no room answers None: the
    name's addresses are not known now."""

    def __init__(self, resolve: Resolve = resolved, *, threads: int = LOOKUP_THREADS,
                 per_tenant: int = LOOKUPS_PER_TENANT) -> None:
        self.resolve = resolve
        self.threads = threads
        self.per_tenant = per_tenant
        self._held: Counter[str] = Counter()
        self._running = 0
        self._lock = threading.Lock()

    def addresses(self, host: str, *, owner: str,
                  timeout_s: float = LOOKUP_S) -> list[Address] | None:
        with self._lock:
            if self._held[owner] >= self.per_tenant or self._running >= self.threads:
                return None
            self._held[owner] += 1
            self._running += 1
        found: list[list[Address]] = []
        done = threading.Event()

        def look() -> None:
            try:
                found.append(list(self.resolve(host)))
            finally:
                with self._lock:
                    self._running -= 1
                    self._held[owner] -= 1
                    if self._held[owner] <= 0:
                        del self._held[owner]
                done.set()

        threading.Thread(target=look, name="webhook-lookup", daemon=True).start()
        if not done.wait(timeout_s):
            return None
        return found[0] if found else []  # a resolver that failed found nothing


def lookups() -> Lookups:
    """This process's lookups, made on first use: one bound for all of its submits."""
    with _made:
        if not _lookups:
            _lookups.append(Lookups())
        return _lookups[0]


_lookups: list[Lookups] = []
_made = threading.Lock()


def _bad(loc: tuple[str | int, ...], msg: str) -> InvalidRequest:
    return InvalidRequest(f"{'.'.join(str(part) for part in loc)}: {msg}",
                          details=[{"loc": list(loc), "msg": msg}])
