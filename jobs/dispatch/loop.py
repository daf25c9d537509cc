"""The dispatcher's loop: lead or stand by, run a round, sleep on the doorbell between rounds.

A leader sleeps on the doorbell (``jobs.index.wake``) between rounds, so a submit or a
released slot is acted on at once, with no polling delay on the hot path; a standby waits to
try the lock again. Both ride out outages of Redis or SQL, never longer than a renewal period.

A lock wait cut by ``lock_timeout`` (a new leader's claim of the ``leadership`` row while a
stalled former leader still holds it, see ``jobs.store.engine``) is no outage: the turn is
tried again after the shortest wait, renewing the lock first, and it is logged once
(``dispatcher.lock_wait_timeout``) until a turn goes through. A session the server ended
under a stalled dispatcher surfaces on waking as an error of an invalidated connection (its
transaction rolled back by the server): an outage like any other, after which the next turn's
renewal tells whether it still leads.
"""

from __future__ import annotations

import logging
import threading

import redis
import sqlalchemy.exc

from jobs.core.cadence import FEED_PERIOD_S, MAINTENANCE_PERIOD_S, MAX_BACKOFF_S, PUBLISH_RETRY_S
from jobs.dispatch.dispatcher import Dispatcher, DispatchStats
from jobs.dispatch.leadership import Leadership
from jobs.dispatch.pools import PoolDispatchers
from jobs.index import wake
from jobs.index.base import NotLeader
from jobs.store.engine import lock_wait_timed_out

logger = logging.getLogger("tierq.dispatcher")

TRANSIENT = (redis.RedisError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)


def transient(exc: Exception) -> bool:
    """An outage the loop rides out: ``TRANSIENT``, or any SQL error whose connection was
    lost under it (a session the server ended, ``idle_in_transaction_session_timeout``:
    PostgreSQL reports it as an internal error)."""
    if isinstance(exc, TRANSIENT):
        return True
    return isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated


def lead_once(
    dispatcher: Dispatcher | PoolDispatchers, leadership: Leadership, now: float
) -> DispatchStats | None:
    """One turn of a dispatcher among several: renew or take the lock; while leading, rebuild
    the index first when due (``Dispatcher.needs_rebuild``), else run a round, with its
    maintenance when that is due. None while standing by, or once a fenced call found
    another process leading."""
    dispatcher.fence = leadership.tick(now)
    if dispatcher.fence is None:
        return None
    dispatcher.keep_lead = lambda: _keep_lead(leadership, dispatcher)
    try:
        if dispatcher.needs_rebuild():
            dispatcher.rebuild(now)
            return DispatchStats(rebuilt=True)
        return dispatcher.run_once(now, maintain=dispatcher.maintenance_due(now))
    except NotLeader:
        leadership.step_down("a fenced call was refused: another process leads")
        dispatcher.fence = None
        return None


def _keep_lead(leadership: Leadership, dispatcher: Dispatcher | PoolDispatchers) -> None:
    """Renew the lock if due, in the middle of long work; NotLeader once it is lost."""
    if leadership.tick(dispatcher.runtime.clock()) != dispatcher.fence:
        raise NotLeader("the leader lock was lost during a full pass")


def run_forever(
    dispatcher: Dispatcher | PoolDispatchers, stop: threading.Event,
    leadership: Leadership | None = None,
) -> None:
    """Loop ``lead_once``: a leader sleeps on the doorbell between rounds, a standby waits to
    try the lock again; both ride out outages (never longer than a renewal period)."""
    runtime = dispatcher.runtime
    if leadership is None:
        leadership = Leadership(runtime.index, ttl_s=runtime.policy.leader_ttl_s)
    longest = min(MAX_BACKOFF_S, leadership.renew_every_s)
    backoff = min(0.5, longest)
    contended = False  # the last turn's lock wait timed out (logged once per streak)
    while not stop.is_set():
        try:
            stats = lead_once(dispatcher, leadership, runtime.clock())
            backoff, contended = min(0.5, longest), False
            if stats is None:
                stop.wait(leadership.retry_every_s)
            elif stats.publish_failed:
                stop.wait(PUBLISH_RETRY_S)  # the broker is down: do not spin on it
            elif not (stats.saturated or stats.rebuilt):
                period = min(MAINTENANCE_PERIOD_S, leadership.wait_s)
                if stats.feed_pending:
                    period = min(period, FEED_PERIOD_S)
                wake.wait(runtime.redis, dispatcher.prefixes, period)
        except Exception as exc:
            if not transient(exc):
                raise
            if lock_wait_timed_out(exc):
                if not contended:
                    contended = True
                    logger.warning("dispatcher.lock_wait_timeout", extra={
                        "event": "dispatcher.lock_wait_timeout", "error": one_line(exc),
                        "retry_s": min(0.5, longest)})
                stop.wait(min(0.5, longest))  # the holder is done or ended soon: no backoff
                continue
            logger.warning("dispatcher.unavailable", extra={"error": str(exc), "retry_s": backoff})
            stop.wait(backoff)
            backoff = min(longest, backoff * 2)


def one_line(exc: Exception) -> str:
    """The error's first line (SQLAlchemy appends the statement and a link)."""
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0] if text else type(exc).__name__
