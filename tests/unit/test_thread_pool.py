"""The worker's thread pool: one spare thread where the worker gates its messages by its
slots (``worker_disable_prefetch``, Redis), none where prefetched messages wait in the pool."""

from __future__ import annotations

import pytest
from celery import Celery

from workers.pool import TaskPool


@pytest.mark.parametrize(("gated", "threads"), [(True, 5), (False, 4)])
def test_the_pool_has_a_spare_thread_only_where_messages_are_gated_by_slots(
    gated: bool, threads: int
) -> None:
    app = Celery("t", set_as_current=False)
    app.conf.worker_disable_prefetch = gated
    pool = TaskPool(limit=4, app=app)
    try:
        assert pool.executor._max_workers == threads
        assert pool.num_processes == 4  # the slots the worker's gate counts
    finally:
        pool.executor.shutdown(wait=False)
