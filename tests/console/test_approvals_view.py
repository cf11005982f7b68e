"""The Approvals view: requests pending first with the change they would allow; `a` approves
and `x` rejects (with a reason) after a confirmation; the requester cannot decide their own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, Input

from engine import ApprovalRequired, ApprovalState, ManualClock, open_engine
from engine.domain.access import Grant, Role
from tests.console.conftest import ConsoleFactory
from tests.console.screen_text import screen_lines
from tests.console.seed import NOW, OPERATOR, commands
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.decide import ConfirmDecision
from vortos_tui.console.views.approvals import ApprovalsView

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]
Compare = Callable[..., bool]


def requests(db: Path) -> dict[str, str]:
    """Two pending requests on invoice-export (sensitive): olga's trigger and alice's
    backfill. Returns {requester: request id}."""
    with open_engine(db, create=False) as trusted:
        for grant in (
            Grant("admin", Role.ADMIN),
            Grant("olga", Role.OPERATOR, "billing"),
            Grant(OPERATOR, Role.APPROVER, "billing"),
        ):
            trusted.storage.operators.grant(grant, by="test", at=NOW)
    found = {}
    clock = ManualClock(NOW)
    with open_engine(db, clock=clock, create=False, commands=commands(), enforce=True) as engine:
        engine.service.four_eyes.new_id = iter(["7f3a2c91e0b4", "c41d09a6b2f8"]).__next__
        for actor, ask in (
            (
                "olga",
                lambda: engine.service.trigger("invoice-export", actor="olga", tenant="billing"),
            ),
            (
                OPERATOR,
                lambda: engine.service.backfill(
                    "invoice-export",
                    start_ms=NOW - 3_600_000,
                    end_ms=NOW,
                    actor=OPERATOR,
                    tenant="billing",
                ),
            ),
        ):
            with pytest.raises(ApprovalRequired) as waiting:
                ask()
            found[actor] = waiting.value.approval.id
    return found


def state_of(db: Path, request: str) -> ApprovalState:
    with open_engine(db, create=False, readonly=True) as engine:
        found = engine.storage.approvals.get(request)
        assert found is not None
        return found.state_at(NOW)


async def decided(app: VortosConsole, done: int) -> None:
    for _ in range(200):
        if app.verbs_done != done:
            return
        await app.settle()
    raise AssertionError(f"the decision never finished (last message: {app.last_message})")


def approvals_console(console_for: ConsoleFactory) -> VortosConsole:
    app = console_for()
    app.ctx.start_view = "approvals"
    return app


def select(app: VortosConsole, request: str) -> None:
    view = app.screen
    assert isinstance(view, ApprovalsView)
    keys = [str(row.key.value) for row in view.query_one("#requests").ordered_rows]  # type: ignore[attr-defined]
    view.query_one("#requests").move_cursor(row=keys.index(request))  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", SIZES)
def test_approvals_view(
    snap_compare: Compare, console_for: ConsoleFactory, seeded_db: Path, size: tuple[int, int]
) -> None:
    ids = requests(seeded_db)

    async def settled(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, VortosConsole)
        await app.settle()
        # olga's request, which alice may decide (the two were asked at the same instant, so
        # which comes first is the store's choice).
        select(app, ids["olga"])
        await app.settle()
        for _ in range(3):
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()

    assert snap_compare(approvals_console(console_for), terminal_size=size, run_before=settled)


async def test_pending_requests_show_with_the_change_they_would_allow(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    requests(seeded_db)
    app = approvals_console(console_for)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.settle()
        await pilot.pause()
        text = "\n".join(screen_lines(app))
    assert text.count("pending") >= 2
    assert "billing/invoice-export" in text
    assert "+ version:" in text


async def test_approving_someone_elses_request_asks_first_then_approves(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    ids = requests(seeded_db)
    app = approvals_console(console_for)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.settle()
        select(app, ids["olga"])
        await pilot.pause()
        await pilot.press("a")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ConfirmDecision)
        assert app.focused is dialog.query_one("#cancel", Button)
        done = app.verbs_done
        await pilot.click("#confirm")
        await decided(app, done)
        assert app.last_message is not None
        assert app.last_message[0] == "information"
        assert app.last_message[1].startswith(f"approved {ids['olga']}")
    assert state_of(seeded_db, ids["olga"]) is ApprovalState.APPROVED


async def test_the_requester_cannot_approve_their_own_request(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    ids = requests(seeded_db)
    app = approvals_console(console_for)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.settle()
        select(app, ids[OPERATOR])
        await pilot.pause()
        shown = {b.binding.id for b in app.screen.active_bindings.values() if b.enabled}
        assert "approve" not in shown  # hidden for the requester
        app.ask_decision("approve", app.screen.selected())  # type: ignore[attr-defined]
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmDecision)
        assert app.last_message == (
            "error",
            f"you asked for {ids[OPERATOR]}: another approver must approve it",
        )
    assert state_of(seeded_db, ids[OPERATOR]) is ApprovalState.PENDING


async def test_a_rejection_needs_a_reason_of_ten_characters(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    ids = requests(seeded_db)
    app = approvals_console(console_for)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.settle()
        select(app, ids["olga"])
        await pilot.pause()
        await pilot.press("x")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ConfirmDecision)
        dialog.query_one("#reason", Input).value = "no"
        dialog.query_one("#confirm", Button).press()
        await pilot.pause()
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDecision)  # still asking
        assert "at least 10 characters" in str(dialog.query_one("#problem").render())
        dialog.query_one("#reason", Input).value = "exports run after month end only"
        done = app.verbs_done
        dialog.query_one("#confirm", Button).press()
        await pilot.pause()
        await decided(app, done)
    assert state_of(seeded_db, ids["olga"]) is ApprovalState.REJECTED


async def test_cancel_decides_nothing(console_for: ConsoleFactory, seeded_db: Path) -> None:
    ids = requests(seeded_db)
    app = approvals_console(console_for)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.settle()
        select(app, ids["olga"])
        await pilot.pause()
        await pilot.press("a")
        await pilot.pause()
        await pilot.press("enter")  # Cancel has the focus
        await pilot.pause()
        assert isinstance(app.screen, ApprovalsView)
    assert state_of(seeded_db, ids["olga"]) is ApprovalState.PENDING
