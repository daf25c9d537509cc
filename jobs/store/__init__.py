"""SQL persistence: the schema (``models``), engines (``engine``), migrations (``migrate``)
and the repository (``repository``), which holds every SQL statement tierq runs.

Repository functions take a ``Session`` first and never commit: the caller owns the
transaction. Writes run in ``with sessions.begin() as session:`` (on SQLite a ``BEGIN
IMMEDIATE``, see ``engine``); reads in ``with sessions() as session:``, never committed.
"""
