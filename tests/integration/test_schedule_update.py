"""Changing a schedule's definition: ScheduleService.update and `vortos schedule edit`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine import (
    Conflict,
    Engine,
    IntervalTrigger,
    ManualClock,
    ScheduleSpec,
    StaleVersion,
    open_engine,
)
from engine.commands.decorators import StaticSchedule
from engine.domain.access import Grant, Role
from engine.domain.approvals import ApprovalRequired
from engine.domain.audit import tenant_chain
from engine.domain.errors import InvalidInput
from engine.domain.timeutil import MINUTE_MS
from tests.conftest import T0, run_cli


def spec(name: str = "report", **changes: object) -> ScheduleSpec:
    base = ScheduleSpec(name, IntervalTrigger(MINUTE_MS, T0), "noop", payload={})
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def engine(tmp_path: Path, clock: ManualClock) -> Iterator[Engine]:
    with open_engine(tmp_path / "vortos.db", clock=clock) as opened:
        opened.service.create(spec(), actor="olga")
        yield opened


def test_a_change_that_keeps_the_timing_keeps_the_cursor(
    engine: Engine, clock: ManualClock
) -> None:
    before = engine.service.get("report")
    clock.advance(30)
    after = engine.service.update(
        spec(overlap=before.overlap, jitter_ms=0, metadata={"team": "fin"}), actor="olga"
    )
    assert after.version == before.version + 1
    assert after.metadata == {"team": "fin"}
    assert (after.next_slot_at, after.id, after.status) == (
        before.next_slot_at,
        before.id,
        before.status,
    )
    entry = engine.storage.audit.latest(tenant_chain("default"), limit=1)[0]
    assert (entry.event, entry.actor) == ("schedule.updated", "olga")
    assert entry.data["before"]["metadata"] == {}
    assert entry.data["definition"]["metadata"] == {"team": "fin"}


def test_a_new_trigger_fires_from_the_first_slot_after_now(
    engine: Engine, clock: ManualClock
) -> None:
    clock.advance(3600)
    after = engine.service.update(spec(trigger=IntervalTrigger(5 * MINUTE_MS, T0)), actor="olga")
    assert after.trigger == IntervalTrigger(5 * MINUTE_MS, T0)
    assert after.next_slot_at == T0 + 60 * MINUTE_MS  # now, not the hour missed under the old


def test_refused_changes_change_nothing(engine: Engine) -> None:
    before = engine.service.get("report")
    with pytest.raises(InvalidInput, match="unknown command"):
        engine.service.update(spec(command="no.such.command"), actor="olga")
    with pytest.raises(StaleVersion):
        engine.service.update(spec(metadata={"a": "b"}), actor="olga", expected_version=99)
    assert engine.service.update(spec(), actor="olga") == before  # the same: a no-op
    engine.service.sync_static([StaticSchedule(spec("coded"), "tests")], actor="deployer")
    with pytest.raises(Conflict, match="is static"):
        engine.service.update(spec("coded", metadata={"a": "b"}), actor="olga")
    assert engine.service.get("report") == before


def test_a_sensitive_change_and_unmarking_sensitive_wait_for_approval(
    tmp_path: Path, clock: ManualClock
) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=clock) as trusted:
        trusted.service.create(spec(sensitive=True), actor="setup")
        trusted.storage.operators.grant(Grant("olga", Role.OPERATOR), by="setup", at=T0)
        trusted.storage.operators.grant(Grant("bea", Role.APPROVER), by="setup", at=T0)
    with open_engine(db, clock=clock, enforce=True) as governed:
        service = governed.service
        unmark = spec(sensitive=False)
        with pytest.raises(ApprovalRequired) as waiting:
            service.update(unmark, actor="olga")
        change = waiting.value.approval.change
        assert change["before"]["sensitive"] is True
        assert change["definition"]["sensitive"] is False
        assert service.get("report", actor="olga").sensitive
        with pytest.raises(ApprovalRequired):  # a different change is a different request
            service.update(spec(sensitive=True, metadata={"x": "y"}), actor="olga")
        service.approve(waiting.value.approval.id, actor="bea")
        assert service.update(unmark, actor="olga").sensitive is False


def test_the_cli_edits_only_what_it_is_given(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    added = run_cli(
        "schedule",
        "add",
        "report",
        "--every",
        "1m",
        "--command",
        "noop",
        "--meta",
        "team=fin",
        "--meta",
        "tier=1",
        db=db,
    )
    assert added.code == 0, added.stderr
    edited = run_cli(
        "schedule", "edit", "report", "--every", "5m", "--meta", "tier=", "--json", db=db
    )
    assert edited.code == 0, edited.stderr
    shown = json.loads(edited.stdout)
    assert shown["trigger"]["every_ms"] == 5 * MINUTE_MS
    assert shown["metadata"] == {"team": "fin"}
    assert shown["command"] == "noop"
    assert shown["version"] == 2
    same = run_cli("schedule", "edit", "report", "--every", "5m", db=db)
    assert same.code == 0
    assert "nothing changed" in same.stderr  # the same interval keeps its slots (and anchor)
    bad = [
        (("schedule", "edit", "nope", "--jitter", "1s"), 3, "no schedule named 'nope'"),
        (("schedule", "edit", "report", "--catch-up-cap", "5"), 2, "--misfire each"),
        (("schedule", "edit", "report", "--dst-missing", "skip"), 2, "only to cron"),
        (("schedule", "edit", "report", "--command", "nope.nope"), 2, "unknown command"),
        (("schedule", "edit", "report", "--expect-version", "1", "--jitter", "2s"), 5, "changed"),
    ]
    for args, code, message in bad:
        result = run_cli(*args, db=db)
        assert result.code == code, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
    final = json.loads(run_cli("schedule", "show", "report", "--json", db=db).stdout)
    assert final["version"] == 2
