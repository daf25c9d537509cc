"""SQL persistence: the schema (``models``), engines (``engine``), migrations (``migrate``)
and the repository (``repository``), which holds every SQL statement tierq runs.

Repository functions take a ``Session`` first and never commit: the caller owns the
transaction (``with session.begin():``).
"""
