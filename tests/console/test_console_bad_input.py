"""`vortos tui` refuses bad options with one clear line and exit code 2 (1 for a database that
is not there), before it opens or creates anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--zone", "Mars/Base"], "unknown time zone 'Mars/Base'"),
        (["--refresh", "5ms"], "refresh interval '5ms' is out of range: use 100ms to 60s"),
        (["--refresh", "soon"], "refresh interval 'soon' is not a duration"),
        (["--lease-ttl", "10ms"], "lease TTL 10ms is too short"),
        (["--demo", "--attach"], "leave out --attach"),
        (["--demo", "--control-socket", "/tmp/x.sock"], "with a control socket the engine runs"),
        (["--web-allow-actions"], "--web-allow-actions goes with --web"),
        (["--web", "--read-only", "--web-allow-actions"], "contradict each other"),
        (["--keymap", "missing.toml"], "keymap file missing.toml does not exist"),
        (["--consumers", "0"], "--consumers"),
        (["--node-id", " "], "--node-id must be printable text"),
    ],
)
def test_bad_options_are_refused_before_anything_is_created(
    tmp_path: Path, args: list[str], message: str
) -> None:
    db = tmp_path / "vortos.db"
    result = run_cli("tui", "--db", str(db), *args)
    assert result.code == 2, result
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not db.exists()


def test_a_keymap_naming_an_unknown_binding_is_refused_with_the_known_ids(tmp_path: Path) -> None:
    keymap = tmp_path / "keys.toml"
    keymap.write_text('[keys]\nbogus = "x"\n', encoding="utf-8")
    result = run_cli("tui", "--db", str(tmp_path / "v.db"), "--keymap", str(keymap))
    assert result.code == 2
    assert "no key binding has the id 'bogus'" in result.stderr
    assert "pause" in result.stderr
    assert "toggle-live" in result.stderr


def test_attaching_to_a_missing_database_says_how_to_create_one(tmp_path: Path) -> None:
    db = tmp_path / "none.db"
    result = run_cli("tui", "--attach", "--db", str(db))
    assert result.code == 1
    assert "no database at" in result.stderr
    assert f"vortos --db {db} db init" in result.stderr
    assert not db.exists()


def test_attaching_to_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "notes.txt"
    db.write_text("not a database\n" * 100, encoding="utf-8")
    result = run_cli("tui", "--attach", "--read-only", "--db", str(db))
    assert result.code == 1
    assert "not a SQLite database" in result.stderr
    assert db.read_text(encoding="utf-8") == "not a database\n" * 100
