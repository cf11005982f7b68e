"""The Audit view: chains with their heads and verification, the newest entries, and `v`."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from tests.console.conftest import ConsoleFactory
from tests.console.screen_text import screen_lines
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
    assert "fire.dispatched" in text


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
