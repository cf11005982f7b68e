"""Helpers for the CLI tests: judging an error's output, and proving a database did not change."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.governance.keys import default_key_file
from tests.conftest import CliResult, run_cli


@dataclass(frozen=True)
class DbState:
    """Everything a database holds: its identity pragmas and a full SQL dump of schema and rows."""

    application_id: int
    user_version: int
    dump: tuple[str, ...]


def db_state(path: Path) -> DbState:
    """Read a database's full content through the stdlib sqlite3 module (not our backend)."""
    assert path.is_file(), f"{path} is not a file"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        user_version = conn.execute("PRAGMA user_version").fetchone()[0]
        dump = tuple(conn.iterdump())
    return DbState(int(application_id), int(user_version), dump)


def table_count(path: Path, table: str) -> int:
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def checkpoint(path: Path) -> None:
    """Fold the WAL into the main file, so the main file alone is the whole database."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def copy_database(source: Path, target: Path) -> Path:
    """A byte copy of a checkpointed database file (see `checkpoint`), with its audit key
    beside it, as a backup restores both: private, as Vortos makes them (a looser copy
    would be tightened, and said so, by the next `vortos run`)."""
    copies = [(source, target)]
    key = default_key_file(source)
    if key.exists():
        copies.append((key, default_key_file(target)))
    for original, copy in copies:
        copy.touch(mode=0o600)
        copy.chmod(0o600)
        copy.write_bytes(original.read_bytes())
    return target


def no_traceback(result: CliResult) -> None:
    for stream in (result.stdout, result.stderr):
        assert "Traceback" not in stream, stream
        assert 'File "' not in stream, stream


def assert_clean_error(result: CliResult, code: int, *words: str) -> str:
    """The documented exit code, one `error: ...` line on stderr naming the problem, no stdout.

    Returns the error line so a test can look closer.
    """
    no_traceback(result)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("error: "), line
    for word in words:
        assert word.lower() in line.lower(), f"{word!r} not in {line!r}"
    assert result.stdout == "", f"stdout should be empty on error, got {result.stdout!r}"
    assert result.code == code, f"exit {result.code}, expected {code}: {line}"
    return line


def assert_usage_error(result: CliResult, option: str) -> None:
    """An option-level problem found by the parser: one line like every other error, exit 2,
    naming the option and where to read about it."""
    no_traceback(result)
    assert result.code == 2, result.stderr
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert option in lines[0], result.stderr
    assert "--help" in lines[0], result.stderr


def cli_json(*args: str, db: Path, env: dict[str, str] | None = None) -> Any:
    """Run a read command with --json and parse its stdout; it must succeed."""
    result = run_cli(*args, "--json", db=db, env=env)
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)
