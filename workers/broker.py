"""What differs between the brokers: the names of tierq's broker entities and their options.

Deployments and test runs that share one broker never share a queue; each owns what it
declares through ``settings.key_prefix``:

- **Redis**: kombu's ``global_keyprefix`` puts every broker key (queues, bindings, Celery's
  remote-control and event channels) under the key prefix, so names stay unprefixed
  (``tier.premium`` on exchange ``tierq``), as they always were.
- **RabbitMQ** (and any other transport): no such option, so the names carry the prefix.
  ``{tierq}:`` becomes ``tierq.`` (hash-tag braces dropped, ``:`` as ``.``): queues
  ``tierq.tier.premium``, exchange ``tierq.jobs``, and Celery's remote-control and event
  exchanges ``tierq.celery`` and ``tierq.celeryev``, so ``inspect``, Flower and a control
  broadcast reach only this deployment's workers.

On RabbitMQ the tier queues are **classic durable queues** (declared ``x-queue-type:
classic``, so a vhost whose default type is quorum does not change them), with persistent
messages and publisher confirms. Not quorum queues, although Celery 5.5+ handles them:

- quorum queues refuse global QoS, so Celery (``worker_detect_quorum_queues``) falls back to
  a prefetch per consumer; a worker consumes one queue per tier, so it could then hold three
  times its concurrency in messages it cannot start yet, where global QoS holds one budget
  per worker;
- with quorum queues Celery's workers declare its native delayed delivery topology (28
  exchanges and queues named ``celery_delayed_*``) shared by every deployment on the vhost,
  and only for ETA tasks, which tierq never sends;
- replication buys nothing here: the broker is not the record of work. A message lost with
  a broker node is a lease that lapses, and the job is dispatched again from SQL and Redis.

On Redis, kombu's ack emulation is off: it keeps a copy of every delivered message in Redis
until its ack, so that a visibility timeout can deliver it again (two more round trips per
message, and the redelivery of long jobs that ``DESIGN.md`` warns of). tierq acks on receipt
and recovers lost work by its leases, never by redelivery: a message lost with its worker is
a lease that lapses.

No ``worker_disable_prefetch`` on RabbitMQ: Celery supports it on Redis only (it gates
kombu's client-side ``can_consume``; RabbitMQ pushes). With ``worker_prefetch_multiplier =
1`` and messages acked as their job starts (on receipt by a pool slot), a worker holds at
most its concurrency in unstarted messages. That costs latency only: the dispatcher
publishes no more jobs than the pool has free slots, and a held job whose lease lapses is
reaped and dispatched again, its held message then stale (the compare-and-set on the
attempt makes it a no-op).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.core.pools import DEFAULT_POOL

REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://")
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")
# The exchange of the tier queues on Redis (bindings stored as ``_kombu.binding.tierq``).
REDIS_EXCHANGE = "tierq"


def is_redis_broker(url: str) -> bool:
    return url.startswith(REDIS_SCHEMES)


def is_amqp_broker(url: str) -> bool:
    return url.startswith(AMQP_SCHEMES)


def name_prefix(key_prefix: str) -> str:
    """The broker name prefix for a key prefix: ``{tierq}:`` → ``tierq.``."""
    name = key_prefix.replace("{", "").replace("}", "").replace(":", ".").strip(".")
    return f"{name}." if name else ""


@dataclass(frozen=True, kw_only=True)
class BrokerNames:
    """Names of one deployment's broker entities; ``prefix`` is empty on Redis."""

    prefix: str
    exchange: str
    control_exchange: str
    event_exchange: str
    # The pool whose tier queues these are (``jobs.core.pools``): ``default``'s keep the
    # names they had before pools (``tier.premium``), another's carry its name
    # (``pool.gpu.tier.premium``). Workers consume their pool's only.
    pool: str = DEFAULT_POOL

    def queue(self, tier: str) -> str:
        if self.pool == DEFAULT_POOL:
            return f"{self.prefix}tier.{tier}"
        return f"{self.prefix}pool.{self.pool}.tier.{tier}"

    def own_queue(self, hostname: str) -> str:
        """A worker's own queue: the next job of a slot it frees (``workers.tasks``)."""
        return f"{self.prefix}worker.{hostname}"

    def kind_queue(self, kind: str) -> str:
        """A kind's queue, consumed only by the workers of the pool that run it: where the
        dispatcher sends its jobs while not every live worker does (``jobs.dispatch.routing``)."""
        if self.pool == DEFAULT_POOL:
            return f"{self.prefix}kind.{kind}"
        return f"{self.prefix}pool.{self.pool}.kind.{kind}"

    def queues(self, tiers: list[str]) -> list[str]:
        return [self.queue(tier) for tier in tiers]

    def exchanges(self) -> list[str]:
        """Every exchange the deployment's processes declare (kombu's pidbox adds
        ``.pidbox`` to the control exchange, and a ``reply.`` one for answers)."""
        control = self.control_exchange
        return [self.exchange, f"{control}.pidbox", f"reply.{control}.pidbox",
                self.event_exchange]


def broker_names(broker_url: str, key_prefix: str, pool: str = DEFAULT_POOL) -> BrokerNames:
    if is_redis_broker(broker_url):  # the key prefix applies below the names
        return BrokerNames(prefix="", exchange=REDIS_EXCHANGE, control_exchange="celery",
                           event_exchange="celeryev", pool=pool)
    prefix = name_prefix(key_prefix)
    return BrokerNames(prefix=prefix, exchange=f"{prefix}jobs",
                       control_exchange=f"{prefix}celery", event_exchange=f"{prefix}celeryev",
                       pool=pool)


def transport_config(broker_url: str, key_prefix: str) -> dict[str, Any]:
    """The Celery settings that depend on the broker (see the module docstring)."""
    names = broker_names(broker_url, key_prefix)
    config: dict[str, Any] = {
        "control_exchange": names.control_exchange,
        "event_exchange": names.event_exchange,
        "event_queue_prefix": f"{names.prefix}celeryev",
    }
    if is_redis_broker(broker_url):
        config["broker_transport_options"] = {"global_keyprefix": key_prefix,
                                              "ack_emulation": False}
        config["worker_disable_prefetch"] = True  # Redis only: Celery ignores it elsewhere
    elif is_amqp_broker(broker_url):
        # py-amqp waits for the broker's ack of each publish: a publish that returns is
        # stored, one that fails raises and the dispatcher hands the job back.
        config["broker_transport_options"] = {"confirm_publish": True}
    return config


def queue_arguments(broker_url: str) -> dict[str, Any] | None:
    return {"x-queue-type": "classic"} if is_amqp_broker(broker_url) else None


# A worker's own queue (and a kind's, once no worker consumes it) outlives its worker this
# long on RabbitMQ, then goes with whatever it holds (stale by then: each message's lease
# has lapsed, and the reaper requeued its job).
OWN_QUEUE_EXPIRES_MS = 600_000


def own_queue_arguments(broker_url: str) -> dict[str, Any] | None:
    if not is_amqp_broker(broker_url):
        return None
    return {"x-queue-type": "classic", "x-expires": OWN_QUEUE_EXPIRES_MS}
