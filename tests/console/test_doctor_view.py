"""The console's Doctor view (failures first, with what to do; `R` runs the checks again), and
the dead-man verdict in the Schedules view (acceptance 5: an overdue schedule shows LATE)."""

from __future__ import annotations

from pathlib import Path

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.domain.timeutil import MINUTE_MS
from engine.governance.doctor import Finding, Report, Status
from tests.console.conftest import ConsoleFactory
from tests.console.screen_text import screen_lines
from tests.console.seed import NOW
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.context import NodeRole, NodeStatus
from vortos_tui.console.views.doctor import DoctorView
from vortos_tui.console.views.schedules import SchedulesView
from vortos_tui.console.widgets import ConsoleHeader

WIDE = (160, 40)


def header(app: VortosConsole) -> str:
    return str(app.screen.query_one(ConsoleHeader).render())


def report(*findings: Finding) -> Report:
    return Report(list(findings))


async def test_failures_come_first_with_what_to_do_and_r_runs_the_checks_again(
    console_for: ConsoleFactory,
) -> None:
    runs: list[int] = []

    def doctor() -> Report:
        runs.append(1)
        return report(
            Finding("storage.wal", Status.PASS, "WAL, synchronous=normal"),
            Finding("queue.dead_letters", Status.FAIL, "2 dead letter(s)", "", "requeue them"),
            Finding("schedule.misfire", Status.WARN, "1 drops missed slots", "", "confirm it"),
        )

    app = console_for()
    app.ctx.doctor = doctor
    app.ctx.start_view = "doctor"
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        assert isinstance(app.screen, DoctorView)
        lines = "\n".join(screen_lines(app))
        order = [lines.index(c) for c in ("queue.dead_letters", "schedule.misfire", "storage.wal")]
        assert order == sorted(order)  # fail, then warn, then pass
        assert "requeue them" in lines
        assert "1 failing, 1 warning(s), 3 checks" in lines
        await app.settle()
        assert len(runs) == 1  # a refresh does not run every check again ...
        await pilot.press("R")
        await app.settle()
        await pilot.pause()
        assert len(runs) == 2  # ... R does


async def test_without_a_doctor_the_view_says_so(console_for: ConsoleFactory) -> None:
    app = console_for()
    app.ctx.start_view = "doctor"
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        assert "the doctor is not available" in "\n".join(screen_lines(app))


async def test_a_schedule_whose_daemon_stopped_for_three_periods_shows_late(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    created = NOW - 3 * MINUTE_MS - 5_000  # created, then no daemon for three periods
    with open_engine(seeded_db, clock=ManualClock(created), create=False) as trusted:
        trusted.service.create(
            ScheduleSpec("forgotten", IntervalTrigger(MINUTE_MS, created), "noop", tenant="ops"),
            actor="setup",
        )
    app = console_for()
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        view = app.screen
        assert isinstance(view, SchedulesView)
        badges = {
            str(view.table.get_row_at(i)[0]): str(view.table.get_row_at(i)[1])
            for i in range(view.table.row_count)
        }
    assert "LATE" in badges["forgotten"]
    assert "LATE" not in badges["heartbeat"]  # the seeded ones fired on time


async def test_an_open_dispatch_breaker_shows_in_the_header(console_for: ConsoleFactory) -> None:
    app = console_for()
    app.ctx.node = lambda: NodeStatus(NodeRole.LEADER, "n1", "open")
    async with app.run_test(size=WIDE) as pilot:
        await app.settle()
        await pilot.pause()
        assert "BREAKER OPEN" in header(app)
        app.ctx.node = lambda: NodeStatus(NodeRole.LEADER, "n1", None)
        await app.settle()
        await pilot.pause()
        assert "BREAKER" not in header(app)
