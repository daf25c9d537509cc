"""COMMITs held on the PostgreSQL server, as a slow disk holds them.

A statement and its COMMIT leave tierq together (``jobs.store.pipeline``), so only the server
can hold that COMMIT back: a deferred constraint trigger waits, at the COMMIT, for an advisory
lock the test holds until it lets go; with ``fail``, that session then ends itself, so the
COMMIT never lands (the database lost at the COMMIT).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import sqlalchemy as sa

KEY = 7_421_701


class HeldCommit:
    """COMMITs of transactions that fired ``AFTER <event> ON <table>`` for a row matching
    ``when`` wait until ``let_go`` (or ``let_go_when``); ``once``: only the first one."""

    def __init__(self, engine: sa.Engine, *, event: str, table: str, when: str | None = None,
                 fail: bool = False, once: bool = False) -> None:
        self._holder = engine.connect()
        self._lock("pg_advisory_lock")
        end = "PERFORM pg_terminate_backend(pg_backend_pid());" if fail else ""
        first = "nextval('held_commits') = 1" if once else "true"
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE SEQUENCE held_commits")
            connection.exec_driver_sql(f"""
                CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF {first} THEN
                        PERFORM pg_advisory_lock_shared({KEY});
                        PERFORM pg_advisory_unlock_shared({KEY});
                        {end}
                    END IF;
                    RETURN NULL;
                END $$""")
            condition = "" if when is None else f"WHEN ({when}) "
            connection.exec_driver_sql(
                f"CREATE CONSTRAINT TRIGGER hold_commit AFTER {event} ON {table} "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW {condition}"
                "EXECUTE FUNCTION hold_commit()")
        self._thread: threading.Thread | None = None

    def _lock(self, function: str) -> None:
        self._holder.execute(sa.text(f"SELECT {function}(:key)"), {"key": KEY})
        self._holder.commit()

    def let_go(self) -> None:
        """The held COMMITs go on (and any to come pass at once)."""
        self._lock("pg_advisory_unlock")

    def let_go_when(self, ready: Callable[[], object]) -> None:
        """Once ``ready()`` has returned (on a thread of its own), the COMMITs go on."""
        def run() -> None:
            try:
                ready()
            finally:
                self.let_go()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(10)
        self._holder.close()
