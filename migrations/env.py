"""Alembic environment for tierq.

The URL comes from, in order: ``config.attributes["connection"]`` (an open connection to
use as is), ``config.attributes["url"]`` (set by ``jobs.store.migrate``), the ``sqlalchemy.url``
option, then the ``TIERQ_DATABASE_URL`` environment variable. Engines are made by
``jobs.store.engine.make_engine``, so SQLite gets the same pragmas and transaction handling as
the application. SQLite runs in batch mode (it cannot ALTER most things in place).
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from jobs.store.engine import make_engine, normalize_url
from jobs.store.models import Base

config = context.config
target_metadata = Base.metadata

if config.config_file_name is not None and "url" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    url = url or os.environ.get("TIERQ_DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: set TIERQ_DATABASE_URL")
    return str(url)


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
        # make_engine has SQLAlchemy emit BEGIN on SQLite too, so DDL is transactional on both
        # backends: a migration that fails halfway leaves nothing behind.
        transactional_ddl=True,
    )


def run_migrations_offline() -> None:
    url = normalize_url(_url())
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        compare_type=True,
        render_as_batch=url.get_backend_name() == "sqlite",
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
