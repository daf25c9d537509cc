"""Tell API processes that something changed, so long-polls and caches need not ask SQL.

Whoever commits a change publishes a hint right after its commit, on one of two channels
(``jobs.index.keys.IndexKeys``):

- ``changed``: the ids of jobs whose status moved (worker, dispatcher, cancel), space
  separated, one PUBLISH per call (``announce``);
- ``progressed``: the id of a job whose handler reported progress (``jobs.index.progress``);
- ``tenants``: the ids of tenants whose record changed (``announce_tenants``).

A hint is never a commit point: publishing is best effort (a failure is logged, never raised
into the caller's hot path), and a hint that is lost costs a waiter one safety-net period and
a cached tenant its TTL, never a wrong answer, because the reader always reads SQL after a
wake.

Each API process runs one ``Listener``: a daemon thread subscribed to both channels that wakes
the ``Waiter`` objects registered for a job (asyncio events, set on their own loop through
``call_soon_threadsafe``) and tells the tenant cache to forget. When the subscription drops
or comes back, every waiter is woken (it re-reads SQL once: hints may have been missed) and
the listener reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import redis
from redis.client import PubSub

from jobs.index.keys import IndexKeys

logger = logging.getLogger("tierq.notify")

# How long the listener blocks on its socket before looking at its stop flag.
POLL_S = 0.5
# Reconnect backoff after the subscription dropped (reset once it is live again).
MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0


# -- publishing ---------------------------------------------------------------------------


def announce(client: redis.Redis, prefix: str, job_ids: Iterable[str]) -> None:
    """Say that these jobs' status changed (call after the SQL commit). Best effort."""
    _publish(client, IndexKeys(prefix).changed, job_ids, what="jobs")


def batch_topic(batch_id: str) -> str:
    """The id a batch's changes are announced under on ``changed`` (beside its items' ids):
    what a batch's event stream waits on."""
    return f"batch:{batch_id}"


def announce_batches(client: redis.Redis, prefix: str, batch_ids: Iterable[str]) -> None:
    """Say that these batches' counts moved (an item admitted, started or ended). Best
    effort."""
    _publish(client, IndexKeys(prefix).changed, map(batch_topic, batch_ids), what="batches")


def announce_tenants(client: redis.Redis, prefix: str, tenant_ids: Iterable[str]) -> None:
    """Say that these tenants' records changed (key, tier, limits). Best effort."""
    _publish(client, IndexKeys(prefix).tenants_changed, tenant_ids, what="tenants")


def _publish(client: redis.Redis, channel: str, ids: Iterable[str], *, what: str) -> None:
    unique = list(dict.fromkeys(ids))
    if not unique:
        return
    try:
        client.publish(channel, " ".join(unique))
    except redis.RedisError:
        logger.warning("notify.publish_failed",
                       extra={"event": "notify.publish_failed", "what": what,
                              "count": len(unique)}, exc_info=True)


# -- waiting --------------------------------------------------------------------------------


# What a waiter is rung for: its job's status moved, or its handler reported progress.
CHANGED, PROGRESSED = "changed", "progressed"
EVERYTHING = frozenset({CHANGED, PROGRESSED})


class Waiter:
    """One long-poll's (or event stream's) doorbell for one job: rung from any thread for
    the news it asked for (``kinds``), awaited on its loop."""

    def __init__(self, job_id: str, loop: asyncio.AbstractEventLoop,
                 kinds: frozenset[str] = frozenset({CHANGED})) -> None:
        self.job_id = job_id
        self.loop = loop
        self.kinds = kinds
        self._event = asyncio.Event()
        self._rung: set[str] = set()

    async def wait(self, timeout_s: float) -> frozenset[str]:
        """What it was rung for before ``timeout_s`` passed (empty: not rung); the ring is
        consumed, so a ring that arrives while the caller re-reads SQL wakes the next
        ``wait`` at once."""
        if not self._event.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout=max(0.0, timeout_s))
            except TimeoutError:
                return frozenset()
        self._event.clear()
        rung, self._rung = frozenset(self._rung), set()
        return rung

    def ring_on_loop(self, kinds: Collection[str] = EVERYTHING) -> None:
        """Ring; only on the waiter's own loop (others go through ``_ring_all``)."""
        self._rung.update(self.kinds & set(kinds))
        self._event.set()


def _ring_all(waiters: Collection[Waiter], kinds: Collection[str] = EVERYTHING) -> None:
    """Ring from any thread: one hand-off per event loop, however many waiters."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Waiter]] = {}
    for waiter in waiters:
        by_loop.setdefault(waiter.loop, []).append(waiter)
    for loop, group in by_loop.items():
        try:
            loop.call_soon_threadsafe(_ring_group, group, kinds)
        except RuntimeError:  # the loop is closed: nobody waits there any more
            pass


def _ring_group(group: list[Waiter], kinds: Collection[str]) -> None:
    for waiter in group:
        waiter.ring_on_loop(kinds)


class Waiters:
    """The waiters of one process, by job id. Thread-safe: the listener rings, request
    handlers add and discard."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[str, set[Waiter]] = {}

    def add(self, job_id: str, loop: asyncio.AbstractEventLoop,
            kinds: frozenset[str] = frozenset({CHANGED})) -> Waiter:
        waiter = Waiter(job_id, loop, kinds)
        with self._lock:
            self._by_job.setdefault(job_id, set()).add(waiter)
        return waiter

    def discard(self, waiter: Waiter) -> None:
        with self._lock:
            group = self._by_job.get(waiter.job_id)
            if group is None:
                return
            group.discard(waiter)
            if not group:
                del self._by_job[waiter.job_id]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(group) for group in self._by_job.values())

    def wake(self, job_ids: Iterable[str], kind: str = CHANGED) -> int:
        """Ring the waiters of these jobs that asked for ``kind``; how many were rung."""
        with self._lock:
            chosen = [w for job_id in set(job_ids) for w in self._by_job.get(job_id, ())
                      if kind in w.kinds]
        _ring_all(chosen, (kind,))
        return len(chosen)

    def wake_all(self) -> int:
        """Ring every waiter (hints may have been missed: each re-reads SQL once)."""
        with self._lock:
            chosen = [w for group in self._by_job.values() for w in group]
        _ring_all(chosen)
        return len(chosen)


# -- listening ------------------------------------------------------------------------------


class Listener:
    """The one subscriber of an API process (a daemon thread, started on first use).

    ``live`` is True while both channels are subscribed: only then may a cache trust that it
    hears about changes. ``on_link(live)`` is called when the subscription is lost and each
    time it is (re)confirmed; ``on_tenants(ids)`` for each tenants message. The connection
    is its own (on Redis at ``url``), named ``client_name`` so it can be found in
    ``CLIENT LIST``.
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        pools: Sequence[str] = (),
        on_tenants: Callable[[list[str]], None] | None = None,
        on_link: Callable[[bool], None] | None = None,
    ) -> None:
        """``pools``: every pool's prefix (``jobs.core.pools``), whose ``changed`` channels
        carry their jobs' moves; none: the root prefix's pool alone."""
        keys = IndexKeys(prefix)
        self._changed = {IndexKeys(one).changed for one in (pools or [prefix])}
        self._progressed = {IndexKeys(one).progress_reported for one in (pools or [prefix])}
        self._tenants = keys.tenants_changed
        self.client_name = f"tierq-listener-{uuid.uuid4().hex[:12]}"
        self._pool = redis.ConnectionPool.from_url(
            url, client_name=self.client_name, socket_connect_timeout=2, socket_timeout=5,
            health_check_interval=30,
        )
        self.waiters = Waiters()
        self._on_tenants = on_tenants
        self._on_link = on_link
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live = False

    @property
    def live(self) -> bool:
        return self._live

    def start(self) -> None:
        """Start listening unless already started (or stopped); cheap to call every time."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name=self.client_name,
                                            daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._stop.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        self.waiters.wake_all()
        self._pool.disconnect()

    def _run(self) -> None:
        backoff = MIN_BACKOFF_S
        while not self._stop.is_set():
            try:
                self._listen()
            except (redis.RedisError, OSError) as exc:
                logger.warning("notify.listener_lost",
                               extra={"event": "notify.listener_lost", "error": str(exc)})
            except Exception:  # a bug must not end listening for the life of the process
                logger.exception("notify.listener_failed",
                                 extra={"event": "notify.listener_failed"})
            was_live = self._live
            self._lost()
            backoff = MIN_BACKOFF_S if was_live else min(MAX_BACKOFF_S, backoff * 2)
            self._stop.wait(backoff)

    def _listen(self) -> None:
        pubsub = PubSub(self._pool)
        try:
            pubsub.subscribe(*sorted(self._changed), *sorted(self._progressed), self._tenants)
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=POLL_S)
                if message is not None:
                    self._handle(message)
        finally:
            try:
                pubsub.close()
            except (redis.RedisError, OSError):
                pass

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "subscribe" and message.get("data") == (
                len(self._changed) + len(self._progressed) + 1):
            self._subscribed()
            return
        if kind != "message":
            return
        channel = _text(message.get("channel"))
        ids = _text(message.get("data")).split()
        if channel in self._changed:
            self.waiters.wake(ids)
        elif channel in self._progressed:
            self.waiters.wake(ids, PROGRESSED)
        elif channel == self._tenants and self._on_tenants is not None:
            self._on_tenants(ids)

    def _subscribed(self) -> None:
        """Both channels confirmed: at first, or again after a reconnection that the client
        made by itself. Either way hints may have been missed until now: every waiter reads
        SQL once more, and the cache starts afresh."""
        self._live = True
        self._changed_link(True)

    def _lost(self) -> None:
        if self._live:
            self._live = False
            self._changed_link(False)

    def _changed_link(self, live: bool) -> None:
        if self._on_link is not None:
            self._on_link(live)
        self.waiters.wake_all()
        event = "notify.listening" if live else "notify.deaf"
        logger.info(event, extra={"event": event})


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
