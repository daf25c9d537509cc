"""Celery workers: queues, the run-job task, handlers."""
