"""The broker of the end-to-end systems: Redis unless a test is parametrised over
``BROKERS`` (``@pytest.mark.parametrize("broker", BROKERS, indirect=True)``). The RabbitMQ
variant starts the machine's RabbitMQ where none answers (``tests.services.require_rabbitmq``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import Broker
from tests.services import require_rabbitmq

BROKERS = ["redis", "rabbitmq"]


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    name = getattr(request, "param", "redis")
    if name == "redis":
        yield Broker(name="redis")
        return
    assert name == "rabbitmq", name
    broker = Broker(name="rabbitmq", rabbit=require_rabbitmq())
    try:
        yield broker
    finally:  # after every System of the test has stopped (they depend on this fixture)
        broker.delete_owned()
