"""Migrations equal the models: ``upgrade head`` on an empty database leaves exactly the
schema of ``jobs.store.models`` (autogenerate finds nothing, and the CHECK constraints, which
autogenerate ignores, are compared by hand), and upgrade -> downgrade -> upgrade works, on
SQLite and PostgreSQL. Also the engine settings every connection (migrations included) gets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from jobs.core.states import Status
from jobs.store.engine import make_engine
from jobs.store.migrate import current, downgrade, head, upgrade
from jobs.store.models import Base

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'empty.db'}"
    url: str = request.getfixturevalue("pg_empty_url")
    return url


@pytest.fixture
def connection(empty_url: str) -> Iterator[sa.Connection]:
    """A connection opened after ``upgrade head``."""
    upgrade(empty_url)
    engine = make_engine(empty_url)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def _schema(url: str) -> dict[str, Any]:
    """Everything the inspector sees, in a form that compares by value."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            return {
                table: _table(inspector, table) for table in sorted(inspector.get_table_names())
            }
    finally:
        engine.dispose()


def _table(inspector: sa.Inspector, table: str) -> dict[str, Any]:
    def plain(value: Any) -> Any:
        """A reflected value as it compares: a partial index's predicate (SQLite reflects
        a clause) as its text."""
        if isinstance(value, dict):
            return {key: plain(inner) for key, inner in value.items()}
        return str(value) if isinstance(value, sa.ClauseElement) else value

    def named(items: list[Any]) -> list[Any]:
        return sorted((repr(sorted(plain(item).items())) for item in items), key=str)

    return {
        "columns": [
            (c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)
        ],
        "pk": inspector.get_pk_constraint(table),
        "fks": named(inspector.get_foreign_keys(table)),
        "indexes": named(inspector.get_indexes(table)),
        "uniques": named(inspector.get_unique_constraints(table)),
        "checks": named(inspector.get_check_constraints(table)),
    }


def test_empty_database_has_no_revision(empty_url: str) -> None:
    assert current(empty_url) is None


def test_upgrade_head_matches_the_models(connection: sa.Connection) -> None:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    assert compare_metadata(context, Base.metadata) == []
    assert context.get_current_revision() == head() == "0016"


def test_check_constraints_match_the_models(connection: sa.Connection) -> None:
    reflected = {
        c["name"]: c["sqltext"] for c in sa.inspect(connection).get_check_constraints("jobs")
    }
    declared = {
        c.name
        for c in Base.metadata.tables["jobs"].constraints
        if isinstance(c, sa.CheckConstraint)
    }
    assert set(reflected) == declared
    assert all(f"'{status.value}'" in reflected["ck_jobs_status"] for status in Status)


def test_index_predicates_match_the_models(connection: sa.Connection) -> None:
    """Autogenerate does not compare partial indexes' predicates: compared here. On
    PostgreSQL the jobs table's indexes are partial as the models declare them; SQLite's are
    whole."""
    dialect = connection.dialect.name
    reflected = {index["name"]: index.get("dialect_options", {}).get(f"{dialect}_where")
                 for index in sa.inspect(connection).get_indexes("jobs")
                 if not index["name"].startswith("uq_")}  # a unique constraint's own index
    declared = {index.name: index.dialect_options[dialect]._non_defaults.get("where")
                if dialect in index.dialect_options else None
                for index in Base.metadata.tables["jobs"].indexes}
    assert set(reflected) == set(declared)

    def words(predicate: Any) -> str | None:
        """A predicate as words, without PostgreSQL's added casts and brackets."""
        if predicate is None:
            return None
        text = str(predicate).replace("::text[]", "").replace("::text", "")
        text = text.replace("::character varying", "")
        text = text.replace("(", " ").replace(")", " ").replace("ARRAY[", "").replace("]", "")
        return " ".join(text.replace("= ANY", "IN").replace(",", " ").split())

    assert {name: words(value) for name, value in reflected.items()} == {
        name: words(value) for name, value in declared.items()}
    partial = {name for name, value in reflected.items() if value is not None}
    assert partial == (set() if dialect == "sqlite" else {
        "ix_jobs_status_order_key", "ix_jobs_status_updated_at", "ix_jobs_finished_at",
        "ix_jobs_tier_started_at", "ix_jobs_tier_finished_at", "ix_jobs_batch_id_batch_index",
        "ix_jobs_status_batch_id_batch_index", "ix_jobs_blob", "ix_jobs_result_blob",
        "ix_jobs_status_id", "ix_jobs_kind_order_key"})


def test_status_check_refuses_an_unknown_state(connection: sa.Connection) -> None:
    tenant = {"id": "t1", "name": "acme", "tier": "free", "api_key_hash": "h", "now": "2024-01-01"}
    connection.execute(
        sa.text(
            "INSERT INTO tenants (id, name, tier, api_key_hash, created_at)"
            " VALUES (:id, :name, :tier, :api_key_hash, :now)"
        ),
        tenant,
    )
    insert = sa.text(
        "INSERT INTO jobs (id, tenant_id, tier, kind, payload, status, attempt, max_attempts,"
        " order_key, created_at, enqueued_at, cancel_requested) VALUES ('j1', 't1', 'free',"
        " 'echo', '{}', :status, 1, 3, 0.0, :now, :now, false)"
    )
    with pytest.raises(sa.exc.IntegrityError):
        with connection.begin_nested():
            connection.execute(insert, {"status": "paused", "now": "2024-01-01"})
    connection.execute(insert, {"status": "queued", "now": "2024-01-01"})


def test_upgrade_downgrade_upgrade(empty_url: str) -> None:
    upgrade(empty_url)
    migrated = _schema(empty_url)
    assert {"tenants", "jobs", "alembic_version"} <= set(migrated)

    downgrade(empty_url, "base")
    assert current(empty_url) is None
    assert set(_schema(empty_url)) <= {"alembic_version"}

    upgrade(empty_url)
    assert current(empty_url) == "0016"
    assert _schema(empty_url) == migrated


def test_sqlite_engine_settings(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'new' / 'dir' / 'tierq.db'}")
    try:
        with engine.connect() as conn:
            pragma = {
                name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("journal_mode", "foreign_keys", "busy_timeout")
            }
    finally:
        engine.dispose()
    assert pragma == {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 5000}
    assert (tmp_path / "new" / "dir" / "tierq.db").exists()


def test_postgres_urls_use_psycopg() -> None:
    engine = make_engine("postgresql://postgres@127.0.0.1:5432/postgres")
    try:
        assert engine.url.drivername == "postgresql+psycopg"
        # No ping per checkout: a connection that died in the pool fails its first statement
        # and the pool replaces it (tests/faults/test_postgres_outage.py).
        assert not engine.pool._pre_ping
        assert isinstance(engine.pool, sa.QueuePool) and engine.pool.size() == 40
    finally:
        engine.dispose()
