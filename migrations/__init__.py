"""The Alembic scripts of tierq's schema (installed as ``jobs.migrations``)."""
