"""Acceptance: at 80x24 every view shows its essentials whole: each schedule's name, state and
next fire; each fire's slot, schedule and state; the detail views' name, state and timing."""

from __future__ import annotations

from textual.pilot import Pilot

from tests.console.conftest import ConsoleFactory
from tests.console.screen_text import screen_lines
from tests.console.seed import specs
from vortos_tui.console.app import VortosConsole

NAMES = [spec.name for _, spec in specs(0)]


async def ready(pilot: Pilot[None], *keys: str) -> list[str]:
    app = pilot.app
    assert isinstance(app, VortosConsole)
    await app.settle()
    for key in keys:
        await pilot.press(key)
        await pilot.pause()
    await app.settle()
    await pilot.pause()
    lines = screen_lines(app)
    assert len(lines) == 24, lines
    assert all(len(line) <= 80 for line in lines), lines
    return lines


def row_of(lines: list[str], name: str) -> str:
    found = [line for line in lines if line.strip().startswith(name + " ")]
    assert len(found) == 1, (name, lines)
    return found[0]


async def test_schedules_at_80x24_show_every_name_state_and_next_fire_whole(
    console_for: ConsoleFactory,
) -> None:
    async with console_for().run_test(size=(80, 24)) as pilot:
        lines = await ready(pilot)
    header = next(line for line in lines if "NAME" in line)
    for column in ("NAME", "STATE", "NEXT", "IN", "LAST"):
        assert column in header, header
    assert row_of(lines, "nightly-report").split()[1:4] == ["active", "03:30:00", "in"]
    assert row_of(lines, "weekly-cleanup").split()[1:4] == ["paused", "-", "paused"]
    assert "SENS" in row_of(lines, "invoice-export")
    for name in NAMES:
        row_of(lines, name)


async def test_live_fires_at_80x24_show_slot_schedule_and_state_whole(
    console_for: ConsoleFactory,
) -> None:
    app = console_for()
    app.ctx.start_view = "fires"
    async with app.run_test(size=(80, 24)) as pilot:
        lines = await ready(pilot)
    header = next(line for line in lines if "SLOT" in line)
    for column in ("SLOT", "SCHEDULE", "STATE", "LATE", "TRY", "TOOK"):
        assert column in header, header
    failed = [line for line in lines if "invoice-export" in line and "dead lettered" in line]
    assert failed, lines
    assert any("rebuild-search-index" in line and "completed" in line for line in lines), lines


async def test_schedule_detail_at_80x24_shows_name_state_and_next_fire_first(
    console_for: ConsoleFactory,
) -> None:
    async with console_for().run_test(size=(80, 24)) as pilot:
        lines = await ready(pilot, *["down"] * 5, "enter")
    assert "nightly-report  active  next 03:30:00 (in 2h)" in lines[3], lines


async def test_run_detail_at_80x24_shows_the_run_its_state_and_its_error_first(
    console_for: ConsoleFactory,
) -> None:
    app = console_for()
    app.ctx.start_view = "fires"
    async with app.run_test(size=(80, 24)) as pilot:
        lines = await ready(pilot, *["down"] * 5, "enter")
    assert lines[3].startswith("run 52 invoice-export  dead lettered"), lines
    assert any("exporter exited with 2" in line for line in lines[4:8]), lines
