"""The console's verbs and keys, driven by Pilot on the seeded database.

Every verb: the confirmation names the schedule and the operator with Cancel focused; cancel
changes nothing; confirm changes the database through the service and the view shows it on the
next refresh; a row changed or deleted by another process meanwhile is refused as stale.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, Input

from engine import (
    Approval,
    AuditOverview,
    FireListQuery,
    ManualClock,
    Overview,
    Page,
    ReadModel,
    Run,
    RunDetail,
    RunKind,
    ScheduleDetail,
    ScheduleListQuery,
    ScheduleRow,
    open_engine,
)
from engine.domain.access import Grant, Role
from engine.ports.runs import RunQuery
from tests.console.conftest import ConsoleFactory
from tests.console.seed import NOW, OPERATOR
from vortos_tui.cli.context import operator
from vortos_tui.console.actions import ConsoleActions
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.dialogs import ConfirmVerb, HelpScreen, JumpTo
from vortos_tui.console.views.fires import FiresView
from vortos_tui.console.views.schedule_detail import ScheduleDetailView
from vortos_tui.console.views.schedules import SchedulesView
from vortos_tui.console.widgets import StatusLine

T = TypeVar("T")

# Due order on the seeded database (see tests/console/seed.py).
ROWS = [
    "heartbeat",
    "invoice-export",
    "sync-inventory",
    "rebuild-search-index",
    "reconcile-ledger",
    "nightly-report",
    "weekly-cleanup",
]


def stored(db: Path, name: str, tenant: str = "ops") -> tuple[str, int, str | None]:
    with open_engine(db, create=False, readonly=True) as engine:
        s = engine.service.get(name, tenant=tenant)
        return s.status.value, s.version, s.pause_note


def manual_runs(db: Path) -> int:
    with open_engine(db, create=False, readonly=True) as engine:
        return sum(1 for r in engine.service.runs(RunQuery(limit=1000)) if r.kind is RunKind.MANUAL)


def cli(db: Path, *args: str) -> None:
    """Another process changes the database (the `vortos` CLI, as this OS account). That account
    and the console's operator are both made admins first: the CLI's first change would make
    only its own account the admin, and the console, reading as OPERATOR, would see nothing."""
    with open_engine(db, create=False) as trusted:
        for who in {operator(), OPERATOR}:
            trusted.storage.operators.grant(Grant(who, Role.ADMIN), by="test", at=NOW)
    done = subprocess.run(
        [sys.executable, "-m", "vortos_tui.cli", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def schedules(app: VortosConsole) -> SchedulesView:
    assert isinstance(app.screen, SchedulesView), app.screen
    return app.screen


def row_names(app: VortosConsole) -> list[str]:
    view = schedules(app)
    return [str(view.table.get_row_at(i)[0]) for i in range(view.table.row_count)]


def selected_name(app: VortosConsole) -> str:
    found = schedules(app).selected()
    assert found is not None
    return found.name


def status_line(app: VortosConsole) -> str:
    return str(app.screen.query_one(StatusLine).render())


async def select(pilot: Pilot[None], app: VortosConsole, name: str) -> None:
    schedules(app).table.move_cursor(row=row_names(app).index(name))
    await pilot.pause()
    assert selected_name(app) == name


async def verb_done(app: VortosConsole, before: int) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while app.verbs_done == before:
        assert asyncio.get_running_loop().time() < deadline, "the verb never finished"
        await asyncio.sleep(0.01)
    await app.settle()


# -- confirmation, cancel, confirm ----------------------------------------------------------


async def test_pause_asks_for_confirmation_naming_schedule_and_operator_with_cancel_focused(
    console_for: ConsoleFactory,
) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "sync-inventory")
        await pilot.press("p")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ConfirmVerb)
        text = " ".join(str(w.render()) for w in dialog.query("Static"))
        assert "ops/sync-inventory" in text
        assert f"as operator {OPERATOR}" in text
        assert app.focused is dialog.query_one("#cancel", Button)


@pytest.mark.parametrize("verb", ["p", "t"])
async def test_cancel_changes_nothing(
    console_for: ConsoleFactory, seeded_db: Path, verb: str
) -> None:
    before = stored(seeded_db, "sync-inventory"), manual_runs(seeded_db)
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "sync-inventory")
        await pilot.press(verb)
        await pilot.pause()
        await pilot.press("enter")  # Cancel has the focus: enter alone cancels
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmVerb)
        assert app.last_message is not None
        assert "cancelled" in app.last_message[1]
    assert (stored(seeded_db, "sync-inventory"), manual_runs(seeded_db)) == before


async def test_escape_cancels_too(console_for: ConsoleFactory, seeded_db: Path) -> None:
    before = stored(seeded_db, "heartbeat")
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await pilot.press("p")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, SchedulesView)
    assert stored(seeded_db, "heartbeat") == before


async def test_confirmed_pause_with_a_note_pauses_and_the_view_shows_it(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "sync-inventory")
        await pilot.press("p")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ConfirmVerb)
        dialog.query_one("#note", Input).focus()
        await pilot.press(*"vendor outage", "enter")  # enter moves to the confirm button
        await pilot.pause()
        assert app.focused is dialog.query_one("#confirm", Button)
        done = app.verbs_done
        await pilot.press("enter")
        await verb_done(app, done)
        assert app.last_message == ("information", "paused ops/sync-inventory")
        # Paused schedules sort after the due ones: the row moved, and says paused.
        view = schedules(app)
        assert row_names(app)[-2:] == ["sync-inventory", "weekly-cleanup"]
        assert "paused" in str(view.table.get_row("s02")[1])
    status, version, note = stored(seeded_db, "sync-inventory")
    assert (status, version, note) == ("paused", 2, "vendor outage")


async def test_confirmed_resume_resumes(console_for: ConsoleFactory, seeded_db: Path) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "weekly-cleanup")
        await pilot.press("u")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmVerb)
        done = app.verbs_done
        await pilot.click("#confirm")
        await verb_done(app, done)
        assert "active" in str(schedules(app).table.get_row("s07")[1])
    assert stored(seeded_db, "weekly-cleanup")[0] == "active"


async def test_confirmed_trigger_adds_a_manual_run_that_live_fires_shows(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    before = manual_runs(seeded_db)
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "nightly-report")
        await pilot.press("t")
        await pilot.pause()
        done = app.verbs_done
        await pilot.click("#confirm")
        await verb_done(app, done)
        assert app.last_message is not None
        assert app.last_message[1].startswith("triggered ops/nightly-report: run ")
        app.switch_view("fires")
        await pilot.pause()
        await app.settle()
        fires = app.screen
        assert isinstance(fires, FiresView)
        newest = fires.table.get_row_at(0)
        assert "nightly-report" in str(newest[1])
        assert str(newest[7]) == "manual"
    assert manual_runs(seeded_db) == before + 1


async def test_pause_of_a_paused_row_needs_no_confirmation_and_changes_nothing(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    before = stored(seeded_db, "weekly-cleanup")
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "weekly-cleanup")
        await pilot.press("p")
        await pilot.pause()
        assert isinstance(app.screen, SchedulesView)
        assert app.last_message == (
            "warning",
            "ops/weekly-cleanup is paused, not active: nothing to pause",
        )
    assert stored(seeded_db, "weekly-cleanup") == before


async def test_verbs_work_from_the_schedule_detail_view(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "heartbeat")
        await pilot.press("enter")
        await pilot.pause()
        await app.settle()
        assert isinstance(app.screen, ScheduleDetailView)
        await pilot.press("p")
        await pilot.pause()
        done = app.verbs_done
        await pilot.click("#confirm")
        await verb_done(app, done)
    assert stored(seeded_db, "heartbeat")[0] == "paused"


# -- stale rows -----------------------------------------------------------------------------


async def test_a_row_paused_by_another_process_after_selection_is_refused_as_stale(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "heartbeat")
        await pilot.press("t")
        await pilot.pause()
        cli(seeded_db, "schedule", "pause", "heartbeat", "--tenant", "ops", "--note", "by bob")
        runs = manual_runs(seeded_db)
        done = app.verbs_done
        await pilot.click("#confirm")
        await verb_done(app, done)
        assert app.last_message is not None
        severity, message = app.last_message
        assert severity == "error"
        assert "changed since you selected it" in message
        assert "nothing was done" in message
    assert manual_runs(seeded_db) == runs
    assert stored(seeded_db, "heartbeat") == ("paused", 2, "by bob")


async def test_a_row_deleted_by_another_process_after_selection_is_refused(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "rebuild-search-index")
        await pilot.press("p")
        await pilot.pause()
        cli(seeded_db, "schedule", "delete", "rebuild-search-index", "--tenant", "ops")
        done = app.verbs_done
        await pilot.click("#confirm")
        await verb_done(app, done)
        assert app.last_message is not None
        assert app.last_message[0] == "error"
        assert "no longer exists" in app.last_message[1]
        assert "rebuild-search-index" not in row_names(app)


# -- read-only, filter, live refresh, jumping -----------------------------------------------


async def test_read_only_hides_every_verb_and_the_keys_do_nothing(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    before = stored(seeded_db, "heartbeat"), manual_runs(seeded_db)
    app = console_for(read_only=True)
    async with app.run_test() as pilot:
        await app.settle()
        shown = {b.binding.id for b in app.screen.active_bindings.values() if b.enabled}
        assert not shown & {"pause", "resume", "trigger"}
        for key in ("p", "u", "t"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, SchedulesView)
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert not any("selected schedule" in title for title in commands)
    assert (stored(seeded_db, "heartbeat"), manual_runs(seeded_db)) == before


async def test_filter_by_tenant_and_by_state(console_for: ConsoleFactory) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await pilot.press("slash", *"tenant:billing", "enter")
        await app.settle()
        assert row_names(app) == ["invoice-export", "reconcile-ledger"]
        assert "filter tenant:billing" in status_line(app)
        await pilot.press("slash")
        await pilot.pause()
        schedules(app).query_one(Input).value = ""
        await pilot.press(*"state:paused", "enter")
        await app.settle()
        assert row_names(app) == ["weekly-cleanup"]
        await pilot.press("slash")
        schedules(app).query_one(Input).value = ""
        await pilot.press(*"report", "enter")
        await app.settle()
        assert row_names(app) == ["nightly-report"]


async def test_a_bad_filter_is_refused_and_the_list_is_kept(console_for: ConsoleFactory) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await pilot.press("slash", *"state:sleeping", "enter")
        await app.settle()
        assert row_names(app) == ROWS
        assert schedules(app).filter.spelled == ""


async def test_escape_in_the_filter_clears_it(console_for: ConsoleFactory) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await pilot.press("slash", *"heart", "enter")
        await app.settle()
        assert row_names(app) == ["heartbeat"]
        await pilot.press("slash", "escape")
        await app.settle()
        assert row_names(app) == ROWS


async def test_space_pauses_live_refresh_says_so_and_r_still_refreshes(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    app = console_for(refresh_s=0.05)
    async with app.run_test() as pilot:
        await app.settle()
        await pilot.press("space")
        await pilot.pause()
        assert "LIVE PAUSED" in status_line(app)
        cli(seeded_db, "schedule", "pause", "heartbeat", "--tenant", "ops")
        polls = app.polls
        await asyncio.sleep(0.3)  # six refresh intervals pass: none may read
        assert app.polls == polls
        assert "active" in str(schedules(app).table.get_row("s01")[1])
        await pilot.press("r")
        await app.settle(polls=0)
        await pilot.pause()
        assert "paused" in str(schedules(app).table.get_row("s01")[1])
        assert "LIVE PAUSED" in status_line(app)
        await pilot.press("space")
        await app.settle()
        assert "LIVE PAUSED" not in status_line(app)


async def test_colon_jumps_between_views_and_escape_goes_back(console_for: ConsoleFactory) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await pilot.press("colon")
        await pilot.pause()
        assert type(app.screen).__name__ == JumpTo.__name__
        await pilot.press(*"fir", "enter")
        await pilot.pause()
        await app.settle()
        fires = app.screen
        assert isinstance(fires, FiresView)
        assert fires.table.row_count > 0
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, SchedulesView)


async def test_help_lists_the_keys_with_their_binding_ids(console_for: ConsoleFactory) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        ids = {binding_id for _, _, binding_id in app.screen.keys}
        assert {"pause", "resume", "trigger", "filter", "jump", "toggle-live", "refresh"} <= ids
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, SchedulesView)


async def test_the_palette_offers_every_view_and_verb(console_for: ConsoleFactory) -> None:
    app = console_for()
    async with app.run_test():
        await app.settle()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"View: Schedules", "View: Live fires"} <= set(titles)
        for verb in ("Pause", "Resume", "Trigger"):
            assert f"{verb} the selected schedule" in titles


async def test_a_keymap_remaps_a_binding_by_id(console_for: ConsoleFactory) -> None:
    app = console_for()
    app._keymap = {"pause": "P"}  # what --keymap loads
    async with app.run_test() as pilot:
        await app.settle()
        await pilot.press("p")
        await pilot.pause()
        assert isinstance(app.screen, SchedulesView)
        await pilot.press("P")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmVerb)


# -- refresh keeps the cursor, paging, degraded -----------------------------------------------


async def test_the_cursor_stays_on_its_row_when_the_rows_move(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "reconcile-ledger")  # fifth row
        cli(seeded_db, "schedule", "pause", "heartbeat", "--tenant", "ops")
        cli(seeded_db, "schedule", "pause", "invoice-export", "--tenant", "billing")
        await app.settle()
        assert row_names(app).index("reconcile-ledger") == 2  # moved up two rows
        assert selected_name(app) == "reconcile-ledger"


async def test_moving_past_the_last_row_loads_the_next_page(console_for: ConsoleFactory) -> None:
    app = console_for(page_size=3)
    async with app.run_test() as pilot:
        await app.settle()
        assert row_names(app) == ROWS[:3]
        await pilot.press("down", "down", "down")
        await app.settle()
        assert row_names(app) == ROWS[3:6]
        assert selected_name(app) == ROWS[3]
        assert "4-6 of 7" in status_line(app)
        await pilot.press("up")
        await app.settle()
        assert row_names(app) == ROWS[:3]
        assert selected_name(app) == ROWS[2]


async def test_an_unreadable_database_shows_the_degraded_banner_and_recovers(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        away = seeded_db.with_name("away.db")
        seeded_db.rename(away)
        await app.settle()
        await pilot.pause()
        line = status_line(app)
        assert "degraded: last good at 00:00:00" in line
        assert "retrying" in line
        assert row_names(app) == ROWS  # the last good rows stay on screen
        away.rename(seeded_db)
        await app.settle()
        await pilot.pause()
        assert "degraded" not in status_line(app)
        assert app.is_running


class SlowReads:
    """The real read model, each read held a while, counting reads in flight at once."""

    def __init__(self, inner: ReadModel) -> None:
        self.inner = inner
        self.in_flight = 0
        self.most = 0
        self.reads = 0

    async def _slow(self, read: Awaitable[T]) -> T:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.05)  # ten times the refresh interval below
            return await read
        finally:
            self.in_flight -= 1
            self.reads += 1

    async def overview(self, now_ms: int) -> Overview:
        return await self._slow(self.inner.overview(now_ms))

    async def schedules(self, query: ScheduleListQuery) -> Page[ScheduleRow]:
        return await self._slow(self.inner.schedules(query))

    async def fires(self, query: FireListQuery) -> Page[Run]:
        return await self._slow(self.inner.fires(query))

    async def schedule(self, schedule_id: str, *, runs: int = 20) -> ScheduleDetail | None:
        return await self._slow(self.inner.schedule(schedule_id, runs=runs))

    async def run(self, run_id: int) -> RunDetail | None:
        return await self._slow(self.inner.run(run_id))

    async def audit(self, chain: str | None = None, *, limit: int = 50) -> AuditOverview:
        return await self._slow(self.inner.audit(chain, limit=limit))

    async def approvals(self, *, limit: int = 100) -> list[Approval]:
        return await self._slow(self.inner.approvals(limit=limit))

    async def close(self) -> None:
        await self.inner.close()


async def test_refreshes_never_overlap_even_when_a_read_outlasts_the_interval(
    console_for: ConsoleFactory,
) -> None:
    app = console_for(refresh_s=0.005)
    slow = SlowReads(app.ctx.model)
    app.ctx.model = slow
    async with app.run_test() as pilot:
        await app.settle()
        for _ in range(5):
            await pilot.press("r")  # asking for more reads does not start them side by side
        deadline = asyncio.get_running_loop().time() + 10
        while slow.reads < 20:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
    assert slow.most == 1


@pytest.mark.parametrize("damage", ["moved away", "replaced by junk"])
async def test_a_damaged_database_file_degrades_and_recovers_when_restored(
    console_for: ConsoleFactory, seeded_db: Path, damage: str
) -> None:
    app = console_for()
    saved = seeded_db.with_name("saved.db")
    async with app.run_test() as pilot:
        await app.settle()
        if damage == "moved away":
            seeded_db.rename(saved)
        else:
            saved.write_bytes(seeded_db.read_bytes())
            seeded_db.write_bytes(b"not a database" * 1000)
        await app.settle()
        await pilot.pause()
        assert "degraded: last good at 00:00:00" in status_line(app)
        await app.settle()  # and again: it keeps trying, and keeps running
        assert app.is_running
        saved.replace(seeded_db)
        await app.settle()
        await pilot.pause()
        assert "degraded" not in status_line(app)
        assert row_names(app) == ROWS


async def test_a_verb_offered_before_a_role_change_was_read_is_refused_by_the_service(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    # The console offers verbs by its newest reading of the grants; the service decides again.
    before = stored(seeded_db, "heartbeat")
    app = console_for()
    app.ctx.actions = ConsoleActions(
        lambda: open_engine(seeded_db, clock=ManualClock(NOW), create=False, enforce=True),
        OPERATOR,
    )
    async with app.run_test() as pilot:
        await app.settle()  # nobody governs the database yet: every verb is offered
        with open_engine(seeded_db, create=False) as engine:
            engine.storage.operators.grant(Grant("root-admin", Role.ADMIN), by="test", at=NOW)
            engine.storage.operators.grant(Grant(OPERATOR, Role.VIEWER, "ops"), by="test", at=NOW)
        await pilot.press("p")  # before the console has read the grants
        await pilot.pause()
        assert isinstance(app.screen, ConfirmVerb)
        done = app.verbs_done
        await pilot.click("#confirm")
        await verb_done(app, done)
        assert app.last_message is not None
        severity, message = app.last_message
    assert severity == "error"
    assert f"{OPERATOR} may not pause in tenant ops" in message
    assert stored(seeded_db, "heartbeat") == before
    app.ctx.actions.close()
