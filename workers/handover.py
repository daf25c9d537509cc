"""A freed slot's next job, handed to this worker's own Celery consumer in-process.

With the thread pool, the job a slot takes next (``jobs.index.hand_over``) runs in this same
process, so its message need not travel through the broker and back: it is built as the
broker would deliver it (Celery's protocol 2, the task ``tierq.run_job``) and given to the
consumer's own message handler on its event loop (``Hub.call_soon`` is thread-safe and wakes
the loop). From there it is a task like any other: Celery reserves it, sends its events (Flower
shows it), and runs it on the next free pool thread, which is the one handing it over as
soon as that task returns. Nothing is acked to a broker: the message was never in one, and
a message lost with its process is a lease that lapses, as with any other message.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from kombu.message import Message

from jobs.index.base import Lease


class HandedOver(Message):
    """A message delivered in-process: there is no broker to acknowledge it to."""

    def ack(self, multiple: bool = False) -> None:
        self._state = "ACK"

    def reject(self, requeue: bool = False) -> None:
        self._state = "REJECTED"

    def requeue(self) -> None:
        self._state = "REQUEUED"


class InProcess:
    """Delivers ``tierq.run_job`` messages to this worker's consumer; ``ready`` once the
    consumer runs (``workers.app`` sets it when the worker is ready)."""

    def __init__(self, app: Any, task_name: str, queue: str) -> None:
        self._app = app
        self._task_name = task_name
        self._queue = queue
        self._consumer: Any = None
        # Celery's headers, properties and body embed for this task, built once: a message
        # differs from the next only by its id and arguments.
        self._template: tuple[dict[str, Any], dict[str, Any], Any] | None = None

    def ready(self, consumer: Any) -> None:
        self._consumer = consumer

    def deliver(self, args: list[Any]) -> None:
        """Hand the task with ``args`` to the consumer; raises when there is none to take it
        (the worker is starting or stopping): the caller puts the job back."""
        consumer = self._consumer
        hub = getattr(consumer, "hub", None) if consumer is not None else None
        task_consumer = getattr(consumer, "task_consumer", None)
        if hub is None or task_consumer is None:
            raise RuntimeError("the worker's consumer is not running")
        message = self._message(args)
        on_message = task_consumer.on_message
        hub.call_soon(on_message, message)

    def _message(self, args: list[Any]) -> HandedOver:
        if self._template is None:
            built = self._app.amqp.as_task_v2("", self._task_name, args=[], kwargs={},
                                              ignore_result=True)
            self._template = (built.headers, built.properties, built.body[2])
        headers, properties, embed = self._template
        task_id = str(uuid.uuid4())
        message = HandedOver(  # type: ignore[no-untyped-call]
            body=json.dumps([args, {}, embed]).encode(), delivery_tag=task_id,
            content_type="application/json", content_encoding="utf-8",
            headers={**headers, "id": task_id, "root_id": task_id, "argsrepr": repr(args)},
            properties={**properties, "correlation_id": task_id},
            delivery_info={"exchange": "", "routing_key": self._queue},
            accept={"application/json"},
        )
        # What decoding the body would give (kombu memoizes it here): the consumer reads the
        # payload without parsing back what was encoded a moment ago. The embed's values are
        # None for this task (no callbacks, chain or chord), so a shallow copy is a fresh one.
        message._decoded_cache = [list(args), {}, dict(embed)]
        return message


def lease_args(lease: Lease, token: str, lease_ttl_s: float) -> list[Any]:
    """``tierq.run_job``'s arguments for a leased job: id, attempt, when leased, token."""
    return [lease.job_id, lease.attempt, lease.expires_at - lease_ttl_s, token]
