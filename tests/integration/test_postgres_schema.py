"""The PostgreSQL schema holds what the SQLite one holds, table for table and column for column:
the stores share one row codec (engine.backends.codec), so a column missing on one backend
would only show when that backend decodes a row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import apsw
import psycopg
import pytest

from engine import open_engine
from engine.backends.postgres.connection import SCHEMA_VERSION
from engine.backends.postgres.migrations import MIGRATIONS
from tests.pg import fresh_schema

# What only PostgreSQL needs: the stable hash that picks a schedule's lease shard, and the
# session that holds an advisory-lock lease.
ONLY_ON_POSTGRES = {"schedules": {"shard_key"}, "lease_sessions": {"key", "pid"}}
# SQLite reuses a deleted largest rowid; PostgreSQL's sequences never do.
ONLY_ON_SQLITE = {"run_id_floor"}


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_schema() as fresh:
        yield fresh


def sqlite_columns(db: Path) -> dict[str, set[str]]:
    open_engine(db).close()
    conn = apsw.Connection(str(db))
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        return {t: {r[1] for r in conn.execute(f"PRAGMA table_info({t})")} for t in tables}
    finally:
        conn.close()


def postgres_columns(url: str) -> dict[str, set[str]]:
    with psycopg.connect(url) as conn:
        found: dict[str, set[str]] = {}
        for table, column in conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema()"
        ):
            found.setdefault(table, set()).add(column)
        return found


def test_every_table_and_column_of_sqlite_is_on_postgresql(url: str, tmp_path: Path) -> None:
    on_sqlite = sqlite_columns(tmp_path / "vortos.db")
    on_postgres = postgres_columns(url)

    for table, columns in on_sqlite.items():
        if table in ONLY_ON_SQLITE:
            continue
        assert table in on_postgres, f"table {table} is missing on PostgreSQL"
        extra = on_postgres[table] - columns - ONLY_ON_POSTGRES.get(table, set())
        assert columns <= on_postgres[table], (table, columns - on_postgres[table])
        assert not extra, (table, extra)
    assert set(on_postgres) - set(on_sqlite) == {"lease_sessions"}


def test_the_schema_version_has_an_upgrade_path_from_the_first() -> None:
    assert all(v in MIGRATIONS for v in range(2, SCHEMA_VERSION + 1))
