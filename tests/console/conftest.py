"""The console's fixtures: a seeded database, a console on it, and snapshots stored under the
top-level `snapshots/` directory, one folder per test module."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import pytest_textual_snapshot
from syrupy.location import PyTestLocation

from engine import ManualClock, open_engine, open_read_model
from tests.console.seed import NOW, OPERATOR, ZONE, build, commands, copy_seeded
from vortos_tui.console.actions import ConsoleActions
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.context import ConsoleContext

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots"


class TopLevelSVGExtension(pytest_textual_snapshot.SVGImageExtension):  # type: ignore[misc]
    """Snapshots in snapshots/<test module>/, not beside the tests. Each module owning its own
    folder is what keeps `--snapshot-update` of one test from deleting other modules' files."""

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        # Spelled through the test's own folder (tests/console/../../snapshots/...), not
        # resolved: syrupy matches snapshot paths against the paths given on the command line,
        # and a resolved path made `--snapshot-update path::one_test` delete its siblings.
        test_file = Path(test_location.filepath)
        return str(test_file.parent / ".." / ".." / SNAPSHOTS.name / test_file.stem)


# snap_compare looks the extension up by this name when it runs.
pytest_textual_snapshot.SVGImageExtension = TopLevelSVGExtension

for variable in ("NO_COLOR", "TEXTUAL_THEME", "TEXTUAL_ANIMATIONS"):
    os.environ.pop(variable, None)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Pilot tests are `async def`: run each on a fresh event loop (no asyncio plugin needed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True


@pytest.fixture(scope="session")
def seeded_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seeded") / "template.db"
    build(path)
    return path


@pytest.fixture
def seeded_db(seeded_template: Path, tmp_path: Path) -> Path:
    return copy_seeded(seeded_template, tmp_path / "vortos.db")


ConsoleFactory = Callable[..., VortosConsole]


@pytest.fixture
def console_for(seeded_db: Path) -> Iterator[ConsoleFactory]:
    """A console on the seeded database at the seeded instant, attached (no engine)."""
    made: list[ConsoleActions] = []

    def make(
        *,
        read_only: bool = False,
        refresh_s: float = 3600.0,
        page_size: int = 200,
        db: Path = seeded_db,
    ) -> VortosConsole:
        clock = ManualClock(NOW)
        actions = None
        if not read_only:
            actions = ConsoleActions(
                lambda: open_engine(db, clock=clock, create=False, commands=commands()),
                OPERATOR,
            )
            made.append(actions)
        ctx = ConsoleContext(
            db_label="vortos.db",
            # As the console reads (see launch): as its operator, so a governed database shows
            # what they may see and the verbs they may use.
            model=open_read_model(db, operator=OPERATOR),
            clock=clock,
            zone=ZONE,
            operator=OPERATOR,
            actions=actions,
            refresh_s=refresh_s,
            page_size=page_size,
        )
        return VortosConsole(ctx)

    yield make
    for actions in made:
        actions.close()
