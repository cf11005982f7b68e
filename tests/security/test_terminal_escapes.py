"""Stored free text cannot steer another operator's terminal.

Promises: every table and line the CLI prints for a person shows an ESC, a C1 character or a bidi
override spelled out (ESC as the four characters \\x1b), never raw; a newline in a one-line place
(a note, a reason, a cell) is spelled \\n, so no forged line; a run's output tail keeps its lines
inside a frame; --json escapes them too; the console (Textual, in a real tmux terminal) shows them
spelled out; and a note or a rejection reason holding a control character is refused at input
with exit 2, changing nothing. The text is seeded with a trusted engine or SQLite directly, as
input now refuses it (it may be in a database from before, or come from a program or plug-in).
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from engine import open_engine
from tests.conftest import run_cli
from tests.console.test_real_terminal import Terminal, console_command, containing

# Cursor up, erase line, a forged line, a title, a clear screen, a C1 CSI, a bidi override.
FORGERY = (
    "ok\r\x1b[2K\x1b[1Apause note  (none)\nsensitive   no"
    "\x1b]0;PWNED\x07\x1b[2J\x9b1A\u202eevil\u2066"
)
# What a terminal would act on: C0 but newline/tab, DEL, C1, bidi overrides and isolates.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def seeded(db: Path, *, schedule_only: bool = False) -> tuple[int, int]:
    """A paused schedule whose note, metadata and payload hold FORGERY, a completed run whose
    error and output tail do, a dead letter whose reason does, an audit entry and a pending
    approval that do. Returns (completed run id, dead run id)."""
    assert (
        run_cli(
            *("schedule", "add", "pe", "--tenant", "acme", "--every", "1h", "--command", "echo"),
            db=db,
        ).code
        == 0
    )
    with open_engine(db, create=False) as engine:
        store = engine.storage.schedules
        s = store.find_by_name("acme", "pe")
        assert s is not None
        store.update(
            replace(
                s,
                status=type(s.status)("paused"),
                pause_note=FORGERY,
                metadata={"owner": FORGERY},
                payload={"msg": FORGERY},
            ),
            s.version,
        )
        if schedule_only:  # the console's own leader would act on the seeded runs
            return 0, 0
        done = engine.service.trigger("pe", actor="root", tenant="acme")
        dead = engine.service.trigger("pe", actor="root", tenant="acme")
    with sqlite3.connect(db) as conn:
        # The ledger's trigger allows only legal moves: a run starts before it ends.
        conn.execute("UPDATE runs SET state = 'running' WHERE id IN (?, ?)", (done.id, dead.id))
        conn.execute(
            "UPDATE runs SET state = 'completed', error = ?, output = ?, exit_code = 0 "
            "WHERE id = ?",
            (FORGERY, f"line one\n{FORGERY}\nlast line\n", done.id),
        )
        conn.execute(
            "UPDATE runs SET state = 'dead_lettered', error = ? WHERE id = ?", (FORGERY, dead.id)
        )
        conn.execute(
            "UPDATE fire_queue SET discarded_at = available_at, discard_reason = ?, "
            "last_error = ? WHERE run_id = ?",
            (FORGERY, FORGERY, dead.id),
        )
        seq, at = conn.execute(
            "SELECT max(seq) + 1, max(at) FROM audit_entries WHERE chain = 'tenant:acme'"
        ).fetchone()
        conn.execute(
            "INSERT INTO audit_entries (chain, seq, event, actor, tenant, at, data, prev_hash, "
            "hash, key_id, signature) VALUES ('tenant:acme', ?, 'schedule.paused', 'root', "
            "'acme', ?, ?, '', '', '', '')",
            (seq, at + 1, json.dumps({"note": FORGERY, "name": "pe"})),
        )
        conn.execute(
            "INSERT INTO approvals (id, tenant, schedule, operation, digest, change, "
            "requested_by, requested_at, expires_at, state) VALUES ('ap1', 'acme', 'pe', "
            "'trigger', 'x', ?, ?, ?, ?, 'pending')",
            (json.dumps({"note": FORGERY}), "bob\x1b[2J", at, at + 3_600_000),
        )
    return done.id, dead.id


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "v.db"


def shown_safely(out: str) -> None:
    assert not RAW.search(out), repr(RAW.search(out))
    assert "\\x1b[2K" in out
    assert "\\x1b]0;PWNED" in out
    assert "\\u202e" in out
    assert "\\x9b" in out
    assert "\\r" in out  # the carriage return too: Rich would have dropped it silently


@pytest.mark.parametrize(
    "argv",
    [
        ("schedule", "show", "pe", "--tenant", "acme"),
        ("audit", "tail", "--chain", "tenant:acme"),
        ("queue", "list", "--tenant", "acme"),
    ],
    ids=["schedule-show", "audit-tail", "queue-list"],
)
def test_stored_escapes_are_spelled_out_in_cli_tables(db: Path, argv: tuple[str, ...]) -> None:
    """Promise: table output shows every steering character spelled out, none raw, and a
    newline in a one-line place is spelled \\n (no forged line)."""
    seeded(db)
    result = run_cli(*argv, db=db)
    assert result.code == 0, result.stderr
    shown_safely(result.stdout)
    assert "(none)\\nsensitive" in result.stdout
    # A forged line would start at the left edge; a folded value starts under its column.
    assert not any(line.startswith("pause note  (none)") for line in result.stdout.splitlines())


def test_schedule_show_has_one_sensitive_line_and_one_pause_note(db: Path) -> None:
    """Promise: the forged note cannot add a `sensitive no` or a `pause note` line."""
    seeded(db)
    out = run_cli("schedule", "show", "pe", "--tenant", "acme", db=db).stdout
    keys = [line.split()[0] for line in out.splitlines() if line and not line[0].isspace()]
    assert keys.count("sensitive") == 1
    assert keys.count("pause") == 1
    assert "meta owner  ok\\r\\x1b[2K" in out  # metadata values too
    assert '"msg":"ok\\r\\u001b' in out.replace(" ", "") or "\\x1b" in out  # payload


def test_schedule_list_and_runs_list_show_nothing_raw(db: Path) -> None:
    """Promise: list tables print no raw steering character."""
    seeded(db)
    for argv in (("schedule", "list"), ("runs", "list", "--tenant", "acme")):
        result = run_cli(*argv, db=db)
        assert result.code == 0, result.stderr
        assert not RAW.search(result.stdout)


def test_runs_show_spells_out_error_and_fences_the_output_tail(db: Path) -> None:
    """Promise: a run's error is one visible line; its output tail keeps its lines, each inside
    a frame, with every steering character spelled out."""
    done, _ = seeded(db)
    result = run_cli("runs", "show", str(done), db=db)
    assert result.code == 0, result.stderr
    shown_safely(result.stdout)
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("output"))
    end = next(i for i in range(start, len(lines)) if "└" in lines[i])
    framed = lines[start : end + 1]  # the output row's frame, a folded long line inside it
    assert "┌" in framed[0]
    assert len(framed) >= 5
    for inner in framed[1:-1]:
        assert inner.count("│") == 2, framed
    assert "line one" in framed[1]
    assert "last line" in framed[-2]


def test_approvals_list_and_show_print_nothing_raw(db: Path) -> None:
    """Promise: an approval's requester and change reach the terminal spelled out, in the
    table and in JSON (where DEL, C1 and bidi overrides are \\u escapes too)."""
    seeded(db)
    listed = run_cli("approvals", "list", "--tenant", "acme", db=db)
    assert listed.code == 0, listed.stderr
    assert not RAW.search(listed.stdout)
    assert "bob\\x1b[2J" in listed.stdout
    shown = run_cli("approvals", "show", "ap1", "--tenant", "acme", db=db)
    assert shown.code == 0, shown.stderr
    assert not RAW.search(shown.stdout)
    assert json.loads(shown.stdout)["change"]["note"] == FORGERY  # the same text to a parser
    assert "\\u009b" in shown.stdout
    assert "\\u202e" in shown.stdout


def test_json_output_escapes_c1_and_bidi(db: Path) -> None:
    """Promise: --json prints no raw steering character and parses back to the stored text."""
    seeded(db)
    result = run_cli("schedule", "show", "pe", "--tenant", "acme", "--json", db=db)
    assert result.code == 0, result.stderr
    assert not RAW.search(result.stdout)
    assert json.loads(result.stdout)["pause_note"] == FORGERY


@pytest.mark.parametrize(
    "note", ["ok\x1b[2Kforged", "two\nlines", "bidi \u202eevil", "c1 \x9b1A", "bell\x07"]
)
def test_a_pause_note_with_a_control_character_is_refused(db: Path, note: str) -> None:
    """Promise: input refuses a note holding a control character: exit 2, a clear message,
    nothing changed."""
    assert run_cli("schedule", "add", "pe", "--every", "1h", "--command", "echo", db=db).code == 0
    result = run_cli("schedule", "pause", "pe", "--note", note, db=db)
    assert result.code == 2, result
    assert "the note holds control characters" in result.stderr
    assert "plain text on one line" in result.stderr
    assert not RAW.search(result.stderr)
    after = json.loads(run_cli("schedule", "show", "pe", "--json", db=db).stdout)
    assert after["status"] == "active"
    assert after["pause_note"] is None


def test_a_rejection_reason_with_a_control_character_is_refused(db: Path) -> None:
    """Promise: `approvals reject --reason` refuses control characters: exit 2, nothing
    changed (the request stays pending)."""
    seeded(db)
    result = run_cli(
        *("approvals", "reject", "ap1", "--tenant", "acme"),
        *("--reason", "looks wrong\x1b[2J to me, sorry"),
        db=db,
        env={"VORTOS_OPERATOR": "carol"},
    )
    assert result.code == 2, result
    assert "the reason holds control characters (\\x1b)" in result.stderr
    shown = json.loads(run_cli("approvals", "show", "ap1", "--tenant", "acme", db=db).stdout)
    assert shown["state"] == "pending"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux: a real terminal")
def test_the_console_in_a_real_terminal_shows_a_forged_note_spelled_out(
    db: Path, tmp_path: Path
) -> None:
    """Promise: in the console (Textual writes cell text straight to the terminal) the note's
    ESC sequences are spelled out: the title is not set, the screen not cleared."""
    seeded(db, schedule_only=True)
    terminal = Terminal(tmp_path)
    try:
        terminal.start([*console_command(), "--db", str(db)], cwd=tmp_path)
        terminal.wait_screen(containing("pe", "paused"), "the schedules list")
        terminal.keys("Enter")
        screen = terminal.wait_screen(containing("pause note"), "the schedule's detail")
        # The grid folds the long note at 80 columns: read it without the layout's spaces.
        flat = "".join(screen.split())
        assert "\\x1b[2K\\x1b[1Apausenote(none)\\nsensitiveno" in flat
        assert "\\x1b]0;PWNED\\x07\\x1b[2J\\x9b1A\\u202eevil" in flat
        assert "vortos" in screen.splitlines()[0]  # the header: the screen was not cleared
        title = terminal.tmux("display-message", "-p", "-t", "console", "#{pane_title}").stdout
        assert "PWNED" not in title
    finally:
        terminal.close()
