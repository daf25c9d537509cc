"""Broker names and options: each deployment's own on RabbitMQ, unchanged on Redis."""

from __future__ import annotations

import pytest

from jobs.process.settings import load_settings
from workers.app import celery_config
from workers.broker import broker_names, name_prefix

pytestmark = pytest.mark.unit

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.mark.parametrize(("key_prefix", "expected"), [
    ("{tierq}:", "tierq."),
    ("{tierq-test-0123abcd}:", "tierq-test-0123abcd."),
    ("{acme}:prod:", "acme.prod."),
    ("{}:", ""),
])
def test_the_name_prefix_is_the_key_prefix_without_its_hash_tag(
    key_prefix: str, expected: str
) -> None:
    assert name_prefix(key_prefix) == expected


def test_rabbitmq_names_carry_the_prefix_and_redis_names_do_not() -> None:
    amqp = broker_names(AMQP, "{tierq}:")
    assert amqp.queue("free") == "tierq.tier.free"
    assert amqp.exchanges() == [
        "tierq.jobs", "tierq.celery.pidbox", "reply.tierq.celery.pidbox", "tierq.celeryev"]
    redis = broker_names("redis://127.0.0.1:6379/0", "{tierq}:")
    assert redis.queue("free") == "tier.free"  # global_keyprefix prefixes the keys
    assert redis.exchange == "tierq"
    # Two deployments on one RabbitMQ share nothing.
    other = broker_names(AMQP, "{other}:")
    assert not set(amqp.exchanges()) & set(other.exchanges())
    assert amqp.queue("free") != other.queue("free")


def test_rabbitmq_gets_classic_durable_queues_confirms_and_its_own_control_exchanges() -> None:
    conf = celery_config(load_settings(broker_url=AMQP, key_prefix="{acme}:"))
    assert [q.name for q in conf["task_queues"]] == [
        "acme.tier.premium", "acme.tier.standard", "acme.tier.free"]
    for queue in conf["task_queues"]:
        assert queue.durable and queue.exchange.name == "acme.jobs"
        assert queue.routing_key == queue.name
        assert queue.queue_arguments == {"x-queue-type": "classic"}
    assert conf["task_default_exchange"] == "acme.jobs"
    assert conf["broker_transport_options"] == {"confirm_publish": True}
    assert conf["worker_prefetch_multiplier"] == 1 and conf["task_acks_late"] is False
    assert "worker_disable_prefetch" not in conf  # Redis only
    assert (conf["control_exchange"], conf["event_exchange"]) == ("acme.celery", "acme.celeryev")


def test_redis_keeps_its_names_and_prefixes_its_keys() -> None:
    conf = celery_config(load_settings(redis_url="redis://127.0.0.1:6379/0",
                                       key_prefix="{acme}:"))
    assert [q.name for q in conf["task_queues"]] == ["tier.premium", "tier.standard", "tier.free"]
    assert all(q.queue_arguments is None for q in conf["task_queues"])
    # acked on receipt: no unacked copy kept in Redis per message (kombu's ack emulation)
    assert conf["broker_transport_options"] == {"global_keyprefix": "{acme}:",
                                                "ack_emulation": False}
    assert conf["worker_disable_prefetch"] is True
    assert (conf["control_exchange"], conf["event_exchange"]) == ("celery", "celeryev")
