"""The worker side without Celery: one attempt of a job, its lease, the handler contract."""
