"""The console's edit (`e`): the options `vortos schedule edit` takes, typed in its dialog, change
exactly those fields through ScheduleService.patch at the version the operator saw; a refusal
names the CLI's flags and changes nothing; cancel changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import open_engine
from engine.service.core import definition
from tests.console.conftest import ConsoleFactory
from tests.console.test_verbs import cli, select, verb_done
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.dialogs import ConfirmVerb


def _definition(db: Path, name: str) -> tuple[dict[str, object], int]:
    with open_engine(db, create=False, readonly=True) as engine:
        found = engine.service.get(name, tenant="ops")
        return definition(found), found.version


def _focused(app: VortosConsole) -> str | None:
    return None if app.focused is None else app.focused.id


async def _edit(console_for: ConsoleFactory, name: str, typed: str) -> tuple[str, str]:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, name)
        await pilot.press("e")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ConfirmVerb)
        assert _focused(app) == "note"  # the changes first; acting is the confirm button
        await pilot.press(*typed, "enter")
        await pilot.pause()
        assert _focused(app) == "confirm"
        done = app.verbs_done
        await pilot.press("enter")
        await verb_done(app, done)
        assert app.last_message is not None
        return app.last_message


@pytest.mark.parametrize(
    ("typed", "field", "value"),
    [
        ("--misfire-grace 5m", "misfire", {"grace_ms": 300_000}),
        ("--jitter 30s", "jitter_ms", 30_000),
        ("--max-attempts 7", "retry", {"max_attempts": 7}),
        ("--meta tier=gold", "metadata", {"tier": "gold"}),
        ("--overlap allow", "overlap", "allow"),
    ],
)
async def test_an_edit_changes_exactly_what_is_typed(
    console_for: ConsoleFactory, seeded_db: Path, typed: str, field: str, value: object
) -> None:
    before, version = _definition(seeded_db, "sync-inventory")
    severity, said = await _edit(console_for, "sync-inventory", typed)
    assert severity == "information", said
    assert said.startswith(f"edited ops/sync-inventory (version {version + 1})"), said
    after, _ = _definition(seeded_db, "sync-inventory")
    for key in before:
        if key != field:
            assert before[key] == after[key], key
    if isinstance(value, dict):
        changed = after[field]
        assert isinstance(changed, dict)
        assert {k: changed[k] for k in value} == value
    else:
        assert after[field] == value


async def test_a_refused_edit_names_the_flags_and_changes_nothing(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    before = _definition(seeded_db, "sync-inventory")
    severity, said = await _edit(console_for, "sync-inventory", "--catch-up-cap 7 --misfire skip")
    assert severity == "error"
    assert "--catch-up-cap" in said
    assert "catch_up_cap=" not in said
    assert _definition(seeded_db, "sync-inventory") == before


async def test_an_unknown_option_or_none_is_refused(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    before = _definition(seeded_db, "sync-inventory")
    severity, said = await _edit(console_for, "sync-inventory", "--colour red")
    assert (severity, "No such option: --colour" in said) == ("error", True), said
    severity, said = await _edit(console_for, "sync-inventory", "--tenant other")
    assert severity == "error"
    assert "selected" in said
    assert _definition(seeded_db, "sync-inventory") == before


async def test_an_edit_of_a_row_changed_meanwhile_is_refused_as_stale(
    console_for: ConsoleFactory, seeded_db: Path
) -> None:
    app = console_for()
    async with app.run_test() as pilot:
        await app.settle()
        await select(pilot, app, "sync-inventory")
        cli(seeded_db, "schedule", "pause", "sync-inventory", "--tenant", "ops")
        await pilot.press("e")
        await pilot.pause()
        await pilot.press(*"--jitter 9s", "enter")
        await pilot.pause()
        done = app.verbs_done
        await pilot.press("enter")
        await verb_done(app, done)
        assert app.last_message is not None
        assert app.last_message[0] == "error"
        assert "changed since you selected it" in app.last_message[1]
    after, version = _definition(seeded_db, "sync-inventory")
    assert after["jitter_ms"] != 9_000
    assert version == 2  # the pause's, and no edit after it
