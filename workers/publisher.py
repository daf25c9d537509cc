"""The dispatcher's Celery adapter: publish "run attempt N of job X" to the job's tier queue.

Never an ETA or a countdown: a retry's backoff is a ``not_before`` kept by the index, and
ETA messages bypass the prefetch limit. On RabbitMQ a publish returns once the broker has
confirmed it (``workers.broker``): a message it could not take is a failed publish. One
producer (and its broker connection) serves every publish; a publish that fails gives it
back to the pool, and the next takes a fresh one.
"""

from __future__ import annotations

from typing import Any

from jobs.process.settings import Settings
from workers.app import base_app, kind_queue, names_of
from workers.tasks import TASK_NAME


class CeleryPublisher:
    """``publish(job_id, attempt, tier)`` for ``jobs.dispatch.dispatcher.Dispatcher``; one thread
    publishes (the dispatcher's loop), so the producer it holds is never shared."""

    def __init__(self, settings: Settings, *, pool: str | None = None) -> None:
        """``pool``: publish to that pool's tier queues (None: the settings' ``pool``)."""
        if pool is not None:
            settings = settings.model_copy(update={"pool": pool})
        self._app = base_app(settings, name="tierq-publisher")
        self._settings = settings
        self._kind_queues: dict[str, Any] = {}  # declared once per kind and publisher
        self._names = names_of(settings)
        self._producer: Any = None

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None,
        kind: str | None = None,
    ) -> None:
        """To ``tier``'s queue; with a ``kind``, to that kind's queue, declared as the
        workers that consume it declare it (``workers.app.kind_queue``)."""
        if self._producer is None:
            self._producer = self._app.producer_pool.acquire(block=True)
        queue: Any = self._names.queue(tier)
        if kind is not None:
            queue = self._kind_queues.get(kind)
            if queue is None:
                queue = self._kind_queues[kind] = kind_queue(self._settings, kind)
        try:
            self._app.send_task(
                TASK_NAME,
                args=[job_id, attempt] if dispatched_at is None else
                     [job_id, attempt, dispatched_at],
                queue=queue,
                routing_key=queue if kind is None else queue.name,
                producer=self._producer,
            )
        except Exception:
            self._give_back()
            raise

    def _give_back(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.release()

    def close(self) -> None:
        self._give_back()
        self._app.close()
