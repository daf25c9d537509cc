"""The fleet's broker: the machine's RabbitMQ, started where none answers
(``tests.services.require_rabbitmq``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import Broker
from tests.services import require_rabbitmq


@pytest.fixture
def rabbitmq() -> Iterator[Broker]:
    broker = Broker(name="rabbitmq", rabbit=require_rabbitmq())
    try:
        yield broker
    finally:  # after the fleet has stopped: its queues and exchanges, by name
        broker.delete_owned()
