"""Alembic, driven from Python: ``tierq migrate``, the tests and ``tierq up`` call these.

The configuration is built in code (no ``alembic.ini`` needed); the migrations ship inside
the package (the top-level ``migrations/``, installed as ``jobs.migrations``), so a plain ``pip
install`` can migrate. The URL travels in
``config.attributes["url"]`` (read by ``migrations/env.py``) and, %-escaped, in
``sqlalchemy.url`` for anything that reads the main options.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from jobs.store.engine import make_engine

# The top-level ``migrations/`` folder, installed as the package ``jobs.migrations``.
MIGRATIONS_DIR = Path(str(resources.files("jobs.migrations")))


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The database's revision (None: never migrated)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head() -> str | None:
    """The newest revision in ``migrations/versions``."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
