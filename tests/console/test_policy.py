"""The console shows only what the operator may do: verbs the policy refuses on a row are hidden
(their key and the palette say why instead), approvals need the approver role in the request's
tenant, and the header says which tenants the operator sees (or that they may see none).

The seeded tenants are ops and billing; the console's operator is OPERATOR (alice)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from engine import ApprovalRequired, ManualClock, open_engine
from engine.domain.access import Grant, Role
from tests.console.conftest import ConsoleFactory
from tests.console.screen_text import screen_lines
from tests.console.seed import NOW, OPERATOR, commands
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.decide import ConfirmDecision
from vortos_tui.console.dialogs import ConfirmVerb
from vortos_tui.console.views.approvals import ApprovalsView
from vortos_tui.console.views.schedule_detail import ScheduleDetailView
from vortos_tui.console.views.schedules import SchedulesView
from vortos_tui.console.widgets import ConsoleHeader, StatusLine

VERBS = {"pause", "resume", "trigger"}
# How the footer labels the keys these tests look for.
FOOTER = {
    "pause": "Pause",
    "resume": "Resume",
    "trigger": "Trigger",
    "approve": "Approve",
    "reject": "Reject",
    "filter": "Filter",
}
Compare = Callable[..., bool]
WIDE = (160, 30)  # the whole footer on one line


def govern(db: Path, *grants: Grant) -> None:
    """A governed database: an admin, and `grants` (trusted: straight into the store)."""
    with open_engine(db, create=False) as trusted:
        for grant in (Grant("root-admin", Role.ADMIN), *grants):
            trusted.storage.operators.grant(grant, by="test", at=NOW)


async def footer_keys(pilot: Pilot[None]) -> set[str]:
    """The keys the footer shows (as drawn, once it has caught up), by binding id."""
    await pilot.pause()
    await pilot.pause()
    words = set(screen_lines(pilot.app)[-1].split())
    return {binding_id for binding_id in FOOTER if FOOTER[binding_id] in words}


def palette_titles(app: VortosConsole) -> list[str]:
    return [command.title for command in app.get_system_commands(app.screen)]


async def select(pilot: Pilot[None], app: VortosConsole, name: str) -> None:
    view = app.screen
    assert isinstance(view, SchedulesView)
    names = [str(view.table.get_row_at(i)[0]) for i in range(view.table.row_count)]
    view.table.move_cursor(row=names.index(name))
    await pilot.pause()
    chosen = view.selected()
    assert chosen is not None
    assert chosen.name == name


def header_text(app: VortosConsole) -> str:
    return str(app.screen.query_one(ConsoleHeader).render())


def status_text(app: VortosConsole) -> str:
    return str(app.screen.query_one(StatusLine).render())


# -- schedule verbs ---------------------------------------------------------------------------


async def test_a_viewer_sees_no_schedule_verbs_in_the_footer(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db, Grant(OPERATOR, Role.VIEWER))
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        assert await footer_keys(pilot) == {"filter"}


async def test_a_hidden_verbs_key_opens_nothing_and_says_why(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db, Grant(OPERATOR, Role.VIEWER))
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await select(pilot, app, "heartbeat")
        await pilot.press("p")
        await pilot.pause()
        assert isinstance(app.screen, SchedulesView)
        assert app.last_message is not None
        severity, message = app.last_message
        shown = [n.message for n in app._notifications]
    assert severity == "error"
    assert message.startswith(f"{OPERATOR} may not pause in tenant ops")
    assert f"vortos operators grant {OPERATOR} operator --tenant ops" in message
    assert message in shown


async def test_an_operator_of_one_tenant_sees_verbs_on_its_rows_only(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(
        seeded_db,
        Grant(OPERATOR, Role.OPERATOR, "ops"),
        Grant(OPERATOR, Role.VIEWER, "billing"),
    )
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await select(pilot, app, "heartbeat")  # ops
        assert await footer_keys(pilot) >= VERBS
        await select(pilot, app, "invoice-export")  # billing
        assert not await footer_keys(pilot) & VERBS
        await select(pilot, app, "sync-inventory")  # ops again
        assert await footer_keys(pilot) >= VERBS


async def test_the_palette_offers_only_the_verbs_the_operator_may_use_on_the_row(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(
        seeded_db,
        Grant(OPERATOR, Role.OPERATOR, "ops"),
        Grant(OPERATOR, Role.VIEWER, "billing"),
    )
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await select(pilot, app, "invoice-export")  # billing
        assert not any("selected schedule" in title for title in palette_titles(app))
        await select(pilot, app, "heartbeat")  # ops
        assert "Pause the selected schedule" in palette_titles(app)


async def test_a_verb_refused_after_the_palette_offered_it_says_why(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db, Grant(OPERATOR, Role.OPERATOR, "ops"))
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await select(pilot, app, "heartbeat")
        pause = next(c for c in app.get_system_commands(app.screen) if c.title.startswith("Pause"))
        with open_engine(seeded_db, create=False) as trusted:
            trusted.storage.operators.revoke(Grant(OPERATOR, Role.OPERATOR, "ops"))
            trusted.storage.operators.grant(Grant(OPERATOR, Role.VIEWER, "ops"), by="test", at=NOW)
        await app.settle()
        await pause.callback()
        await pilot.pause()
        assert isinstance(app.screen, SchedulesView)
        assert app.last_message is not None
        assert app.last_message[1].startswith(f"{OPERATOR} may not pause in tenant ops")


async def test_schedule_detail_hides_the_verbs_and_its_keys_say_why(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(
        seeded_db,
        Grant(OPERATOR, Role.OPERATOR, "ops"),
        Grant(OPERATOR, Role.VIEWER, "billing"),
    )
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await select(pilot, app, "invoice-export")  # billing
        await pilot.press("enter")
        await app.settle()
        await pilot.pause()
        assert isinstance(app.screen, ScheduleDetailView)
        assert not await footer_keys(pilot) & VERBS
        await pilot.press("t")
        await pilot.pause()
        assert isinstance(app.screen, ScheduleDetailView)
        assert app.last_message is not None
        assert app.last_message[1].startswith(f"{OPERATOR} may not trigger in tenant billing")


async def test_schedule_detail_offers_the_verbs_in_the_operators_tenant(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db, Grant(OPERATOR, Role.OPERATOR, "ops"))
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await select(pilot, app, "heartbeat")
        await pilot.press("enter")
        await app.settle()
        await pilot.pause()
        assert isinstance(app.screen, ScheduleDetailView)
        assert await footer_keys(pilot) >= VERBS
        await pilot.press("p")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmVerb)


async def test_a_role_revoked_meanwhile_hides_the_verbs_at_the_next_refresh(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db, Grant(OPERATOR, Role.OPERATOR))
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        assert await footer_keys(pilot) >= VERBS
        with open_engine(seeded_db, create=False) as trusted:
            trusted.storage.operators.revoke(Grant(OPERATOR, Role.OPERATOR))
            trusted.storage.operators.grant(Grant(OPERATOR, Role.VIEWER), by="test", at=NOW)
        await app.settle()
        await pilot.pause()
        assert not await footer_keys(pilot) & VERBS


async def test_a_remapped_hidden_verb_still_says_why(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db, Grant(OPERATOR, Role.VIEWER))
    app = console_for()
    app._keymap = {"pause": "P"}  # what --keymap loads
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.press("P")
        await pilot.pause()
        assert isinstance(app.screen, SchedulesView)
        assert app.last_message is not None
        assert app.last_message[1].startswith(f"{OPERATOR} may not pause")


# -- approvals --------------------------------------------------------------------------------


def olgas_request(db: Path, alice: Role) -> str:
    """olga (operator in billing) asks to trigger invoice-export (sensitive); alice holds
    `alice` in billing. Returns the request's id."""
    govern(db, Grant("olga", Role.OPERATOR, "billing"), Grant(OPERATOR, alice, "billing"))
    clock = ManualClock(NOW)
    with (
        open_engine(db, clock=clock, create=False, commands=commands(), enforce=True) as engine,
        pytest.raises(ApprovalRequired) as waiting,
    ):
        engine.service.trigger("invoice-export", actor="olga", tenant="billing")
    return waiting.value.approval.id


async def approvals_ready(app: VortosConsole, pilot: Pilot[None]) -> ApprovalsView:
    await app.settle()
    await pilot.pause()
    view = app.screen
    assert isinstance(view, ApprovalsView)
    assert view.selected() is not None
    return view


async def test_an_operator_without_the_approver_role_sees_no_approve_or_reject(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    olgas_request(seeded_db, Role.OPERATOR)
    app = console_for()
    app.ctx.start_view = "approvals"
    async with app.run_test(size=WIDE) as pilot:
        await approvals_ready(app, pilot)
        assert not await footer_keys(pilot) & {"approve", "reject"}
        await pilot.press("a")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmDecision)
        assert app.last_message is not None
        assert app.last_message[1].startswith(f"{OPERATOR} may not approve in tenant billing")


async def test_an_approver_in_the_requests_tenant_sees_approve_and_reject(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    olgas_request(seeded_db, Role.APPROVER)
    app = console_for()
    app.ctx.start_view = "approvals"
    async with app.run_test(size=WIDE) as pilot:
        await approvals_ready(app, pilot)
        assert {"approve", "reject"} <= await footer_keys(pilot)
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDecision)


# -- the header and the status line ----------------------------------------------------------


async def test_the_header_names_the_tenants_a_scoped_operator_sees(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db, Grant(OPERATOR, Role.OPERATOR, "ops"))
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        assert "tenants: ops" in header_text(app)


async def test_the_header_names_no_tenant_for_an_operator_of_every_tenant(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db, Grant(OPERATOR, Role.VIEWER))
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        assert "tenants" not in header_text(app)


async def test_an_operator_without_any_role_is_told_what_to_ask_for(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db)
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        status = status_text(app)
        header = header_text(app)
    assert (
        f"no role in this database: ask an admin for `vortos operators grant {OPERATOR} viewer`"
        in status
    )
    assert "tenants: none" in header


async def test_an_ungoverned_database_says_nothing_of_roles(console_for: ConsoleFactory) -> None:
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        assert "role" not in status_text(app)
        assert "tenants" not in header_text(app)
        assert await footer_keys(pilot) >= VERBS


def test_a_viewer_of_one_tenant(
    snap_compare: Compare, console_for: ConsoleFactory, seeded_db: Path
) -> None:
    govern(seeded_db, Grant(OPERATOR, Role.VIEWER, "ops"))

    async def settled(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, VortosConsole)
        await app.settle()
        for _ in range(3):
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()

    assert snap_compare(console_for(), terminal_size=(80, 24), run_before=settled)
