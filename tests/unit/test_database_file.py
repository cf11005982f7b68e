"""Opening database files: create, upgrade, or refuse what is not ours, changing nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import apsw
import pytest

from engine import ManualClock, StorageError, open_engine
from engine.backends.sqlite import connection
from engine.backends.sqlite.connection import APPLICATION_ID, SCHEMA_VERSION, upgrade


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_new_file_gets_the_schema_in_wal_mode(db_path: Path, clock: ManualClock) -> None:
    with open_engine(db_path, clock=clock) as engine:
        info = engine.storage.describe()
    assert info["schema_version"] == SCHEMA_VERSION
    assert info["journal_mode"] == "wal"


def test_an_empty_file_is_initialised(db_path: Path, clock: ManualClock) -> None:
    db_path.touch()
    with open_engine(db_path, clock=clock) as engine:
        assert engine.storage.describe()["schedules"] == 0


def test_reopening_keeps_what_is_stored(db_path: Path, clock: ManualClock) -> None:
    with open_engine(db_path, clock=clock) as engine:
        engine.storage.leases.acquire("k", "t", "h", 60_000)
    with open_engine(db_path, clock=clock) as engine:
        assert engine.storage.leases.current("k") is not None


def test_a_directory_is_refused(tmp_path: Path, clock: ManualClock) -> None:
    with pytest.raises(StorageError, match="is a directory"):
        open_engine(tmp_path, clock=clock)


def test_a_text_file_is_refused_and_left_alone(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("shopping list\n")
    with pytest.raises(StorageError, match="not a SQLite database"):
        open_engine(path, clock=clock)
    assert path.read_text() == "shopping list\n"


def test_another_applications_database_is_refused_and_left_alone(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "other.db"
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.close()
    before = digest(path)
    with pytest.raises(StorageError, match="another application"):
        open_engine(path, clock=clock)
    assert digest(path) == before


def test_a_newer_schema_is_refused(db_path: Path, clock: ManualClock) -> None:
    open_engine(db_path, clock=clock).close()
    conn = apsw.Connection(str(db_path))
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StorageError, match="newer than this Vortos"):
        open_engine(db_path, clock=clock)


def test_a_corrupt_file_is_refused(db_path: Path, clock: ManualClock) -> None:
    open_engine(db_path, clock=clock).close()
    data = bytearray(db_path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the first page's b-tree header and cells
    db_path.write_bytes(bytes(data))
    with (
        pytest.raises(StorageError, match=r"corrupt|not a SQLite"),
        open_engine(db_path, clock=clock) as engine,
    ):
        engine.storage.describe()


def test_an_older_schema_is_upgraded_in_place(
    db_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_engine(db_path, clock=clock).close()
    # Pretend the next release adds a column: version SCHEMA_VERSION + 1.
    monkeypatch.setattr(connection, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(
        connection.MIGRATIONS, SCHEMA_VERSION + 1, "ALTER TABLE schedules ADD COLUMN owner TEXT"
    )
    open_engine(db_path, clock=clock).close()
    conn = apsw.Connection(str(db_path))
    assert conn.execute("PRAGMA user_version").fetchall()[0][0] == SCHEMA_VERSION + 1
    assert "owner" in [r[1] for r in conn.execute("PRAGMA table_info(schedules)")]
    assert conn.execute("PRAGMA application_id").fetchall()[0][0] == APPLICATION_ID
    conn.close()


def test_a_failing_upgrade_changes_nothing(db_path: Path, clock: ManualClock) -> None:
    open_engine(db_path, clock=clock).close()
    conn = apsw.Connection(str(db_path))
    broken = {
        SCHEMA_VERSION + 1: "ALTER TABLE schedules ADD COLUMN owner TEXT",
        SCHEMA_VERSION + 2: "ALTER TABLE no_such_table ADD COLUMN x TEXT",
    }
    with pytest.raises(apsw.SQLError):
        upgrade(conn, SCHEMA_VERSION, broken, SCHEMA_VERSION + 2)
    assert conn.execute("PRAGMA user_version").fetchall()[0][0] == SCHEMA_VERSION
    assert "owner" not in [r[1] for r in conn.execute("PRAGMA table_info(schedules)")]
    conn.close()


def test_an_upgrade_without_a_path_is_refused(db_path: Path, clock: ManualClock) -> None:
    open_engine(db_path, clock=clock).close()
    conn = apsw.Connection(str(db_path))
    with pytest.raises(StorageError, match="no upgrade path"):
        upgrade(conn, SCHEMA_VERSION, {}, SCHEMA_VERSION + 1)
    conn.close()


def test_reading_a_missing_database_creates_nothing(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(StorageError, match="no database"):
        open_engine(path, clock=clock, create=False, readonly=True)
    assert not path.exists()


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _shape(conn: apsw.Connection) -> tuple[dict[str, list[tuple[object, ...]]], list[object]]:
    """Every table's columns (in order, with types, defaults, keys) and every index/trigger."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    columns = {t: [tuple(r) for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
    others = sorted(
        tuple(r)
        for r in conn.execute(
            "SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('index', 'trigger')"
        )
    )
    return columns, list(others)


def test_a_version_1_database_upgrades_to_exactly_the_current_schema(
    db_path: Path, clock: ManualClock, tmp_path: Path
) -> None:
    old = apsw.Connection(str(db_path))
    old.execute((FIXTURES / "schema_v1.sql").read_text())
    old.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    old.execute("PRAGMA user_version = 1")
    old.execute(
        "INSERT INTO schedules (id, tenant, name, trigger_kind, trigger_spec, timezone, command, "
        "payload, misfire, overlap, status, version, created_at, updated_at) VALUES ('s1', "
        "'default', 'kept', 'interval', '{\"every_ms\":60000,\"anchor_ms\":0}', 'UTC', 'noop', "
        '\'{}\', \'{"kind":"latest","catch_up_cap":100,"max_age_ms":86400000,'
        "\"grace_ms\":60000}', 'skip', 'active', 1, 0, 0)"
    )
    old.close()
    with open_engine(db_path, clock=clock) as engine:
        kept = engine.service.get("kept")
        assert kept.origin.value == "dynamic"
        assert kept.retry.max_attempts == 3
    fresh_path = tmp_path / "fresh.db"
    open_engine(fresh_path, clock=clock).close()
    upgraded, fresh = apsw.Connection(str(db_path)), apsw.Connection(str(fresh_path))
    assert _shape(upgraded) == _shape(fresh)
    assert upgraded.execute("PRAGMA user_version").fetchall()[0][0] == SCHEMA_VERSION
    upgraded.close()
    fresh.close()
