"""All SQL: the schema (``models``), engines (``engine``), migrations (``migrate``), and one
module of statements per aggregate: ``jobs``, ``tenants``, ``batches``, ``blobs``, ``stats``,
``upkeep`` (the leader's rows), with ``rows`` turning rows into domain values.

Statement functions take a ``Session`` first and never commit: the caller owns the
transaction. Writes run in ``with sessions.begin() as session:`` (on SQLite a ``BEGIN
IMMEDIATE``, see ``engine``); reads in ``with sessions() as session:``, never committed.
Callers import them under a ``_sql`` name (``from jobs.store import jobs as jobs_sql``).
"""
