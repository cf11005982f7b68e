"""`vortos schedule add/edit --timeout`: a schedule's own time limit for its command's runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.support import assert_clean_error, cli_json, db_state
from tests.conftest import run_cli


def _add(db: Path, *options: str) -> None:
    result = run_cli(
        *("schedule", "add", "poll", "--every", "1m", "--command", "noop", *options), db=db
    )
    assert result.code == 0, result.stderr


def test_add_stores_the_timeout_and_show_reports_it(db_path: Path) -> None:
    _add(db_path, "--timeout", "90s")
    shown = cli_json("schedule", "show", "poll", db=db_path)
    assert shown["timeout_ms"] == 90_000
    table = run_cli("schedule", "show", "poll", db=db_path)
    assert "1m30s" in table.stdout or "90s" in table.stdout


def test_add_without_a_timeout_leaves_the_commands_own(db_path: Path) -> None:
    _add(db_path)
    assert "timeout_ms" not in cli_json("schedule", "show", "poll", db=db_path)


def test_edit_changes_the_timeout_and_none_removes_it(db_path: Path) -> None:
    _add(db_path, "--timeout", "2s")
    assert run_cli("schedule", "edit", "poll", "--timeout", "5m", db=db_path).code == 0
    assert cli_json("schedule", "show", "poll", db=db_path)["timeout_ms"] == 300_000
    assert run_cli("schedule", "edit", "poll", "--timeout", "none", db=db_path).code == 0
    assert "timeout_ms" not in cli_json("schedule", "show", "poll", db=db_path)


@pytest.mark.parametrize(
    ("given", "words"),
    [
        pytest.param("soon", ("timeout", "soon"), id="garbage"),
        pytest.param("-1s", ("--timeout", "negative"), id="negative"),
        pytest.param("0s", ("--timeout", "zero"), id="zero"),
        pytest.param("8d", ("timeout", "7d"), id="over-a-week"),
        # Past any duration's bound, the bound named is still the time limit's (it said 3660d).
        pytest.param("3661d", ("timeout", "at most 7d"), id="over-any-duration"),
    ],
)
def test_a_bad_timeout_is_refused_and_changes_nothing(
    db_path: Path, given: str, words: tuple[str, ...]
) -> None:
    _add(db_path)
    before = db_state(db_path)
    result = run_cli("schedule", "edit", "poll", "--timeout", given, db=db_path)
    assert_clean_error(result, 2, *words)
    assert db_state(db_path) == before
