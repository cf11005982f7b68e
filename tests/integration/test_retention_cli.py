"""`vortos retention set|remove|show` and `vortos prune`, in real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine import ManualClock, RunState, open_engine
from engine.domain.access import Role
from engine.domain.audit import tenant_chain
from engine.domain.timeutil import DAY_MS
from tests.cli.support import db_state, no_traceback
from tests.conftest import CliResult, cli_env
from tests.integration.test_retention import fresh_run, history

REPO = Path(__file__).resolve().parents[2]

# The `vortos` command with the retention commands mounted, whether or not the CLI's app
# registers them already.
LAUNCHER = textwrap.dedent(
    """
    from vortos_tui.cli import retention
    from vortos_tui.cli.app import app
    from vortos_tui.cli.output import EXIT_CODES, run_typer

    if "retention" not in {g.name for g in app.registered_groups}:
        app.add_typer(retention.app, name="retention", epilog=EXIT_CODES)
    if "prune" not in {c.name for c in app.registered_commands}:
        app.command("prune", epilog=EXIT_CODES)(retention.prune)
    run_typer(app, "vortos")
    """
)


def vortos(db: Path, *args: str) -> CliResult:
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, "--db", str(db), *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=120,
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Runs of acme and held finished 40 days ago (real time), and a fresh one."""
    path = tmp_path / "vortos.db"
    past = ManualClock(int(time.time() * 1000) - 40 * DAY_MS)
    with open_engine(path, clock=past) as engine:
        history(engine, "acme", 4)
        history(engine, "held", 3)
        history(engine, "acme", 1, state=RunState.DEAD_LETTERED)
    with open_engine(path) as engine:
        fresh_run(engine)
    return path


def test_set_show_and_remove_an_override(db: Path) -> None:
    done = vortos(db, "retention", "set", "--tenant", "held", "--days", "0", "--reason", "court")
    assert done.code == 0, done.stderr
    assert "kept forever (legal hold)" in done.stderr

    shown = vortos(db, "retention", "show", "--json")
    assert shown.code == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert (view["days"], view["dead_letter_days"]) == (30, 90)
    assert [(o["tenant"], o["days"], o["legal_hold"], o["reason"]) for o in view["overrides"]] == [
        ("held", 0, True, "court")
    ]
    table = vortos(db, "retention", "show")
    assert "held" in table.stdout
    assert "legal hold" in table.stdout

    removed = vortos(db, "retention", "remove", "--tenant", "held")
    assert removed.code == 0, removed.stderr
    assert json.loads(vortos(db, "retention", "show", "--json").stdout)["overrides"] == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--days", "5"], "needs --tenant"),
        (["--tenant", "acme"], "needs --days"),
        (["--tenant", "acme", "--days", "-1"], "negative"),
        (["--tenant", "acme", "--days", "ten"], "ten"),
        (["--tenant", "Bad Name!", "--days", "5"], "tenant"),
        (["--tenant", "acme", "--days", "99999"], "century"),
    ],
)
def test_a_bad_retention_set_exits_2_and_changes_nothing(
    db: Path, args: list[str], says: str
) -> None:
    before = db_state(db)

    done = vortos(db, "retention", "set", *args)

    assert done.code == 2, (done.stdout, done.stderr)
    assert says in done.stderr
    no_traceback(done)
    assert db_state(db) == before


def test_remove_without_a_tenant_exits_2(db: Path) -> None:
    done = vortos(db, "retention", "remove")
    assert done.code == 2
    assert "needs --tenant" in done.stderr


def test_removing_a_missing_override_exits_3(db: Path) -> None:
    before = db_state(db)
    done = vortos(db, "retention", "remove", "--tenant", "acme")
    assert done.code == 3
    assert "no retention override" in done.stderr
    assert db_state(db) == before


def test_only_an_admin_may_set_retention(db: Path) -> None:
    with open_engine(db, enforce=True) as engine:
        engine.service.grant_role("someone-else", Role.ADMIN, actor="someone-else")
    before = db_state(db)

    done = vortos(db, "retention", "set", "--tenant", "acme", "--days", "0")

    assert done.code == 4, done.stderr
    assert "manage-retention" in done.stderr
    assert db_state(db) == before


def test_prune_dry_run_reports_and_changes_nothing(db: Path) -> None:
    assert vortos(db, "retention", "set", "--tenant", "held", "--days", "0").code == 0
    before = db_state(db)

    done = vortos(db, "prune", "--dry-run", "--json")

    assert done.code == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["dry_run"] is True
    assert [(t["tenant"], t["runs"]) for t in report["tenants"]] == [("acme", 4)]
    assert db_state(db) == before


def test_prune_removes_what_is_past_the_retention_and_audits_it(db: Path) -> None:
    assert vortos(db, "retention", "set", "--tenant", "held", "--days", "0").code == 0

    done = vortos(db, "prune")

    assert done.code == 0, done.stderr
    assert "pruned 4 run(s), 4 fire(s), 0 dead letter(s)" in done.stderr
    assert "acme" in done.stdout
    with open_engine(db, readonly=True) as engine:
        runs = engine.storage.runs.count()
        entries = engine.storage.audit.entries(tenant_chain("acme"))
    assert runs == 3 + 1 + 1  # held's, the dead letter (kept 90 days), the fresh one
    (pruned,) = [e for e in entries if e.event == "runs.pruned"]
    assert (pruned.data["runs"], pruned.data["trigger"]) == (4, "manual")


def test_prune_json_is_the_report(db: Path) -> None:
    done = vortos(db, "prune", "--json")

    assert done.code == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["runs"], report["truncated"], report["dry_run"]) == (7, False, False)
    assert report["settings"]["days"] == 30


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        # Changes go through the socket (here nothing serves it: said clearly).
        (["retention", "set", "--tenant", "acme", "--days", "3"], 1, "nothing serves"),
        (["prune"], 1, "nothing serves"),
    ],
)
def test_changes_with_a_control_socket_go_through_it_or_are_refused_clearly(
    db: Path, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    before = db_state(db)

    done = vortos(db, "--control-socket", str(tmp_path / "vortos.sock"), *args)

    assert done.code == code, done.stderr
    assert message in done.stderr
    assert db_state(db) == before
