"""Every view at 80x24 and at 160x48, on the seeded database at the seeded instant.

Regenerate after an intended change of the screens (serially):
    python -m pytest tests/console/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.pilot import Pilot

from tests.console.conftest import ConsoleFactory
from vortos_tui.console.app import VortosConsole

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]
Compare = Callable[..., bool]


def settled(*keys: str) -> Callable[[Pilot[None]], object]:
    """Press `keys`, then wait until the view in front has read its data."""

    async def run(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, VortosConsole)
        await app.settle()
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        await app.settle()
        # Static updates re-lay out the page over a few frames (scrollbars last): let them.
        for _ in range(3):
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()

    return run


@pytest.mark.parametrize("size", SIZES)
def test_schedules_view(
    snap_compare: Compare, console_for: ConsoleFactory, size: tuple[int, int]
) -> None:
    assert snap_compare(console_for(), terminal_size=size, run_before=settled())


@pytest.mark.parametrize("size", SIZES)
def test_live_fires_view(
    snap_compare: Compare, console_for: ConsoleFactory, size: tuple[int, int]
) -> None:
    app = console_for()
    app.ctx.start_view = "fires"
    assert snap_compare(app, terminal_size=size, run_before=settled())


@pytest.mark.parametrize("size", SIZES)
def test_schedule_detail_view(
    snap_compare: Compare, console_for: ConsoleFactory, size: tuple[int, int]
) -> None:
    # The sixth row, nightly-report (Europe/Berlin): its next slots cross tonight's DST gap.
    keys = ("down",) * 5 + ("enter",)
    assert snap_compare(console_for(), terminal_size=size, run_before=settled(*keys))


@pytest.mark.parametrize("size", SIZES)
def test_run_detail_view(
    snap_compare: Compare, console_for: ConsoleFactory, size: tuple[int, int]
) -> None:
    # Live fires, newest first; the fourth row is a failed invoice export with its error.
    app = console_for()
    app.ctx.start_view = "fires"
    assert snap_compare(
        app, terminal_size=size, run_before=settled("down", "down", "down", "down", "down", "enter")
    )


def test_pause_confirmation(snap_compare: Compare, console_for: ConsoleFactory) -> None:
    assert snap_compare(console_for(), terminal_size=(80, 24), run_before=settled("p"))


def test_read_only_footer_has_no_verbs(snap_compare: Compare, console_for: ConsoleFactory) -> None:
    assert snap_compare(console_for(read_only=True), terminal_size=(80, 24), run_before=settled())


def test_help(snap_compare: Compare, console_for: ConsoleFactory) -> None:
    assert snap_compare(console_for(), terminal_size=(80, 24), run_before=settled("question_mark"))
