"""The Audit view: chains with their heads and verification, the newest entries, `v`, and `V`
(a full verification on a worker, with progress, cancellable with `x`)."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from engine import open_engine
from engine.domain.audit import AuditEvent
from engine.governance.audit import Progress, Verification
from tests.console.conftest import ConsoleFactory
from tests.console.screen_text import screen_lines
from vortos_tui.console.actions import VERIFY_PAGE, ConsoleActions, VerifyRun
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.views.audit import AuditView

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]
Compare = Callable[..., bool]


def audit_console(console_for: ConsoleFactory, **options: object) -> VortosConsole:
    app = console_for(**options)
    app.ctx.start_view = "audit"
    return app


async def verified(app: VortosConsole) -> None:
    done = app.verbs_done
    assert isinstance(app.screen, AuditView)
    await app.screen.run_action("verify")
    deadline = 100
    while app.verbs_done == done and deadline:
        await app.settle()
        deadline -= 1
    await app.settle()


def sqlite3_edit(db: Path, sql: str) -> None:
    """An edit made with the file's own tools, the guards dropped first."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("DROP TRIGGER IF EXISTS audit_entries_no_update")
        conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


def settled(pilot: Pilot[None]) -> object:
    async def run() -> None:
        app = pilot.app
        assert isinstance(app, VortosConsole)
        await app.settle()
        for _ in range(3):
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()

    return run()


@pytest.mark.parametrize("size", SIZES)
def test_audit_view(
    snap_compare: Compare, console_for: ConsoleFactory, size: tuple[int, int]
) -> None:
    assert snap_compare(audit_console(console_for), terminal_size=size, run_before=settled)


async def test_the_audit_view_lists_every_chain_and_the_newest_entries(
    console_for: ConsoleFactory,
) -> None:
    app = audit_console(console_for)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.settle()
        await pilot.pause()
        lines = screen_lines(app)
    text = "\n".join(lines)
    for chain in ("system", "tenant:billing", "tenant:ops"):
        assert chain in text
    assert "never verified" in text
    assert "fires.dispatched" in text


async def test_v_verifies_and_the_view_shows_the_chains_verified_to_their_heads(
    console_for: ConsoleFactory,
) -> None:
    app = audit_console(console_for)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.settle()
        await verified(app)
        await pilot.pause()
        assert app.last_message is not None
        assert app.last_message[0] == "information"
        assert "3 audit chain(s) intact" in app.last_message[1]
        text = "\n".join(screen_lines(app))
    assert "never verified" not in text
    assert text.count("verified to head") == 3


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="needs the sqlite3 shell")
async def test_v_on_a_tampered_chain_says_which_entry_is_broken(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    subprocess.run(
        [
            "sqlite3",
            str(seeded_db),
            "DROP TRIGGER audit_entries_no_update; "
            "UPDATE audit_entries SET actor = 'mallory' WHERE chain = 'tenant:ops' AND seq = 3;",
        ],
        check=True,
        timeout=30,
    )
    app = audit_console(console_for)
    async with app.run_test(size=(100, 30)):
        await app.settle()
        await verified(app)
        assert app.last_message is not None
        severity, message = app.last_message
    assert severity == "error"
    assert "tenant:ops is BROKEN at entry 3" in message


async def test_read_only_hides_verify(console_for: ConsoleFactory) -> None:
    app = audit_console(console_for, read_only=True)
    async with app.run_test():
        await app.settle()
        shown = {b.binding.id for b in app.screen.active_bindings.values() if b.enabled}
        assert "verify" not in shown
        assert "verify-full" not in shown


async def test_moving_to_another_chain_shows_its_entries(console_for: ConsoleFactory) -> None:
    app = audit_console(console_for)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.settle()
        view = app.screen
        assert isinstance(view, AuditView)
        view.query_one("#chains").focus()
        await pilot.press("up", "up")
        await app.settle()
        await pilot.pause()
        assert view.chain == "system"
        assert "leader.acquired" in "\n".join(screen_lines(app))


class HeldVerification:
    """The console's real verification, held once it is part way (so the test can look at the
    progress it shows) until `release` is set."""

    def __init__(self, actions: ConsoleActions) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self._verify = actions.verify_audit

        def held(
            *,
            full: bool = False,
            progress: Progress | None = None,
            cancelled: Callable[[], bool] | None = None,
        ) -> Verification:
            def told(checked: int, total: int) -> None:
                if progress is not None:
                    progress(checked, total)
                if full and 0 < checked < total and not self.reached.is_set():
                    self.reached.set()
                    assert self.release.wait(60), "the test never released the verification"

            return self._verify(full=full, progress=told, cancelled=cancelled)

        actions.verify_audit = held  # type: ignore[method-assign]


def grown(db: Path, entries: int) -> None:
    """More entries in tenant:ops, so a full verification reads several pages."""
    with open_engine(db, create=False) as engine:
        engine.storage.audit.append(
            [AuditEvent("test.event", actor="bench", tenant="ops") for _ in range(entries)]
        )


def running(app: VortosConsole) -> VerifyRun | None:
    return app.verify_run


async def until(app: VortosConsole, done: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "the console never got there"
        await asyncio.sleep(0.01)
    await app.settle()


async def test_full_verify_finds_an_edit_the_incremental_one_trusted_and_shows_progress(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    grown(seeded_db, 3 * VERIFY_PAGE)
    app = audit_console(console_for)
    async with app.run_test(size=(120, 30)) as pilot:
        await app.settle()
        await verified(app)  # `v`: every chain verified to its head, marks signed
        assert app.last_message is not None
        assert app.last_message[0] == "information"
        sqlite3_edit(
            seeded_db,
            "UPDATE audit_entries SET actor = 'mallory' WHERE chain = 'tenant:ops' AND seq = 3",
        )
        await verified(app)  # `v` again: nothing new, the edit is before the mark
        assert app.last_message is not None
        severity, said = app.last_message
        assert severity == "information"
        assert "0 entries checked now" in said
        assert "trusted from the signed mark" in said
        assert "V verifies them too" in said
        assert app.ctx.actions is not None
        hold = HeldVerification(app.ctx.actions)
        done = app.verbs_done
        await pilot.press("V")
        await until(app, hold.reached.is_set)
        shown = "\n".join(screen_lines(app))
        assert "full verify: " in shown
        assert "entries checked" in shown
        assert "x cancels" in shown
        run = running(app)
        assert run is not None
        assert 0 < run.checked < (run.total or 0)
        hold.release.set()
        await until(app, lambda: app.verbs_done > done)
        assert app.last_message is not None
        severity, said = app.last_message
        assert severity == "error"
        assert "tenant:ops is BROKEN at entry 3" in said
        assert running(app) is None
        assert "x cancels" not in "\n".join(screen_lines(app))


async def test_a_full_verify_can_be_cancelled_and_claims_nothing(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    grown(seeded_db, 3 * VERIFY_PAGE)
    app = audit_console(console_for)
    async with app.run_test(size=(120, 30)) as pilot:
        await app.settle()
        assert app.ctx.actions is not None
        hold = HeldVerification(app.ctx.actions)
        done = app.verbs_done
        await pilot.press("V")
        await until(app, hold.reached.is_set)
        await pilot.press("x")
        hold.release.set()
        await until(app, lambda: app.verify_run is None)
        assert app.last_message is not None
        assert "full verify cancelled" in app.last_message[1]
        await until(app, lambda: not [w for w in app.workers if w.group == "verify"])
        assert app.verbs_done == done  # no verdict came after the cancel
        assert "intact" not in app.last_message[1]
