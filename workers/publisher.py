"""The dispatcher's Celery adapter: publish "run attempt N of job X" to the job's tier queue.

Never an ETA or a countdown: a retry's backoff is a ``not_before`` kept by the index, and
ETA messages bypass the prefetch limit. Sends reuse pooled broker connections.
"""

from __future__ import annotations

from jobs.config import Settings
from workers.app import base_app, queue_name
from workers.tasks import TASK_NAME


class CeleryPublisher:
    """``publish(job_id, attempt, tier)`` for ``jobs.dispatcher.Dispatcher``."""

    def __init__(self, settings: Settings) -> None:
        self._app = base_app(settings, name="tierq-publisher")

    def publish(self, job_id: str, attempt: int, tier: str) -> None:
        with self._app.producer_or_acquire() as producer:
            self._app.send_task(
                TASK_NAME,
                args=[job_id, attempt],
                queue=queue_name(tier),
                routing_key=queue_name(tier),
                producer=producer,
            )

    def close(self) -> None:
        self._app.close()
