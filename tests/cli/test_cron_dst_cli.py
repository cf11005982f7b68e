"""The cron and DST rules as an operator meets them in the CLI (the cron/DST issue's findings 2
and 6 and acceptance 4): a cron that can only fire in a gap is refused in words, preview shows
the offsets in full at 80 columns with the rules in force, `show` and `--help` name them."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import run_cli

BERLIN = ("--tz", "Europe/Berlin")


def add(db: Path, name: str, cron: str, *args: str) -> None:
    added = run_cli(
        "schedule", "add", name, "--cron", cron, *BERLIN, "--command", "noop", *args, db=db
    )
    assert added.code == 0, added.stderr


def test_a_cron_whose_every_slot_is_in_the_gap_is_refused_quickly_and_stores_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "v.db"
    started = time.monotonic()
    refused = run_cli(
        "schedule", "add", "never", "--cron", "30 2 * 3 L0", *BERLIN, "--dst-missing", "skip",
        "--command", "noop", db=db,
    )  # fmt: skip
    assert refused.code == 2, refused
    assert time.monotonic() - started < 30  # a process start; the search itself is milliseconds
    assert "never fires in Europe/Berlin" in refused.stderr
    assert "'shift' or 'transition'" in refused.stderr
    assert "Traceback" not in refused.stderr
    if db.exists():  # a refused add need not have created the database at all
        listed = run_cli("schedule", "list", "--json", db=db)
        assert json.loads(listed.stdout) == []


def test_an_edit_that_would_never_fire_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    add(db, "night", "30 2 * 3 L0")  # shift: the gap slot fires at 03:30
    refused = run_cli("schedule", "edit", "night", "--dst-missing", "skip", db=db)
    assert refused.code == 2, refused
    shown = json.loads(run_cli("schedule", "show", "night", "--json", db=db).stdout)
    assert shown["trigger"]["dst_missing"] == "shift"
    assert shown["version"] == 1


def test_preview_at_80_columns_shows_local_utc_and_dst_in_full_with_the_rules(
    tmp_path: Path,
) -> None:
    db = tmp_path / "v.db"
    add(db, "gap", "30 2 * * *", "--dst-missing", "transition")
    shown = run_cli(
        "schedule", "preview", "gap", "--from", "2027-03-27T00:00:00Z", "--count", "3", db=db,
        env={"COLUMNS": "80"},
    )  # fmt: skip
    assert shown.code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert any(
        "2027-03-28T03:00:00+02:00" in line
        and "2027-03-28T01:00:00Z" in line
        and "DST gap: at the transition" in line
        for line in lines
    ), shown.stdout
    assert "…" not in shown.stdout
    assert "repeated hour auto (first: fixed time), skipped hour transition" in shown.stdout
    assert "slot keys: --json or a wider terminal" in shown.stdout
    wide = run_cli("schedule", "preview", "gap", "--from", "2027-03-27T00:00:00Z", db=db)
    assert "SLOT KEY" in wide.stdout


def test_auto_fires_a_wildcard_cron_in_both_passes_and_says_so(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    add(db, "hourly", "0 * * * *")
    preview = run_cli(
        "schedule", "preview", "hourly", "--from", "2026-10-24T23:30:00Z", "--count", "3",
        "--json", db=db,
    )  # fmt: skip
    slots = json.loads(preview.stdout)
    assert [(s["local"], s["dst"]) for s in slots] == [
        ("2026-10-25T02:00:00+02:00", "repeated hour, 1st"),
        ("2026-10-25T02:00:00+01:00", "repeated hour, 2nd"),
        ("2026-10-25T03:00:00+01:00", None),
    ]
    shown = run_cli("schedule", "show", "hourly", db=db)
    assert "repeated hour auto (both: wildcard time), skipped hour shift" in shown.stdout


def test_a_bad_from_instant_is_a_clean_error(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    add(db, "x", "0 * * * *")
    bad = run_cli("schedule", "preview", "x", "--from", "yesterday", db=db)
    assert bad.code == 2, bad
    assert "Traceback" not in bad.stderr


def test_help_names_auto_and_transition() -> None:
    helped = run_cli("schedule", "add", "--help", env={"COLUMNS": "200"})
    assert "auto" in helped.stdout
    assert "transition" in helped.stdout
    assert "cron(8)" in helped.stdout


def test_an_edit_of_the_cron_keeps_the_dst_rules_it_is_not_given(tmp_path: Path) -> None:
    """Found by the issue's attacker: `edit --cron` reset the rules to auto/shift."""
    db = tmp_path / "v.db"
    add(db, "w", "0 3 * * *", "--dst-missing", "skip", "--dst-repeated", "last")
    assert run_cli("schedule", "edit", "w", "--cron", "0 4 * * *", db=db).code == 0
    trigger = json.loads(run_cli("schedule", "show", "w", "--json", db=db).stdout)["trigger"]
    assert (trigger["dst_repeated"], trigger["dst_missing"]) == ("last", "skip")
    assert (
        run_cli(
            "schedule", "edit", "w", "--cron", "0 5 * * *", "--dst-repeated", "first", db=db
        ).code
        == 0
    )
    trigger = json.loads(run_cli("schedule", "show", "w", "--json", db=db).stdout)["trigger"]
    assert (trigger["dst_repeated"], trigger["dst_missing"]) == ("first", "skip")
    # Kept, so a cron that can only fire in the gap is refused under the kept 'skip'.
    refused = run_cli("schedule", "edit", "w", "--cron", "30 2 * 3 L0", db=db)
    assert refused.code == 2, refused
