"""The console on PostgreSQL: the seeded history, copied row for row from the SQLite file into a
PostgreSQL schema, reads the same on every view, line for line: the read model is the only thing
that differs. (Copied, not built twice: within one dispatch transaction the backends may number
runs of schedules due at the same instant in another order, a history just as true.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import psycopg
import pytest
from textual.pilot import Pilot

from engine import ManualClock, open_read_model
from engine.backends.sql.diagnostics import TABLES as ENGINE_TABLES
from engine.domain.database import PlainDatabase
from tests.console.screen_text import screen_lines
from tests.console.seed import NOW, OPERATOR, ZONE
from tests.pg import fresh_schema
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.context import ConsoleContext

SIZE = (160, 48)


# Every table the engine reads, parents first (fire_queue references runs).
TABLES = (*ENGINE_TABLES, "retention_overrides")


def copy_rows(source: Path, url: str) -> None:
    """Every row of the SQLite file's tables into the same tables at `url`."""
    sqlite = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        with psycopg.connect(url) as pg:
            for table in TABLES:
                columns = [r[1] for r in sqlite.execute(f"PRAGMA table_info({table})")]
                rows = list(sqlite.execute(f"SELECT {', '.join(columns)} FROM {table}"))
                if rows:
                    marks = ", ".join(["%s"] * len(columns))
                    pg.cursor().executemany(
                        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows
                    )
    finally:
        sqlite.close()


@pytest.fixture
def seeded_url(seeded_db: Path) -> Iterator[str]:
    with fresh_schema() as url:
        copy_rows(seeded_db, url)
        yield url


def console_on(db: PlainDatabase, start_view: str) -> VortosConsole:
    """A read-only console on `db` at the seeded instant (no verbs: nothing to compare)."""
    ctx = ConsoleContext(
        db_label="seeded",
        model=open_read_model(db, operator=OPERATOR),
        clock=ManualClock(NOW),
        zone=ZONE,
        operator=OPERATOR,
        actions=None,
        refresh_s=3600.0,
        page_size=200,
    )
    ctx.start_view = start_view
    return VortosConsole(ctx)


async def screen(
    db: PlainDatabase, start_view: str, *keys: str, like: list[str] | None = None
) -> list[str]:
    """The screen once it stops changing (two equal reads in a row), or, given `like`, once it
    reads as that, within 30 seconds: on a busy machine a view's rows may still be filling
    in after the first read."""
    app = console_on(db, start_view)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot, *keys)
        lines = screen_lines(app)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if like is not None and lines == like:
                break
            await app.settle()
            # A pause with nothing to do: the table measures its columns when idle, and a
            # loop of back-to-back refreshes on a busy machine may never let it.
            await pilot.pause(0.1)
            again = screen_lines(app)
            if like is None and again == lines:
                break
            lines = again
        return lines


async def settled(pilot: Pilot[None], *keys: str) -> None:
    app = pilot.app
    assert isinstance(app, VortosConsole)
    await app.settle()
    for key in keys:
        await pilot.press(key)
        await pilot.pause()
    await app.settle()
    await pilot.pause()


@pytest.mark.parametrize(
    ("view", "keys"),
    [
        pytest.param("schedules", (), id="schedules"),
        pytest.param("schedules", ("down", "down", "down", "enter"), id="schedule-detail"),
        pytest.param("fires", (), id="live-fires"),
        pytest.param("fires", ("down", "enter"), id="run-detail"),
        pytest.param("approvals", (), id="approvals"),
        pytest.param("audit", (), id="audit"),
    ],
)
async def test_every_view_reads_the_same_on_postgresql_as_on_sqlite(
    seeded_db: Path, seeded_url: str, view: str, keys: tuple[str, ...]
) -> None:
    on_sqlite = await screen(seeded_db, view, *keys)
    on_postgres = await screen(seeded_url, view, *keys, like=on_sqlite)

    # Whole screens on a mismatch: a banner or an empty table says why.
    assert on_postgres == on_sqlite, "\n".join(["postgres:", *on_postgres, "sqlite:", *on_sqlite])
    assert any(line.strip() for line in on_postgres[3:]), on_postgres  # not an empty screen
