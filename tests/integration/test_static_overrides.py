"""Static overrides: an operator's pause or resume of a code-declared schedule outlives
deploys until cleared, is visible wherever the schedule is shown, and is audited."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import apsw
import pytest

from engine import (
    Conflict,
    Engine,
    IntervalTrigger,
    ManualClock,
    ScheduleSpec,
    ScheduleStatus,
    open_engine,
)
from engine.commands.decorators import StaticSchedule
from engine.domain.access import Grant, Role
from engine.domain.approvals import ApprovalRequired
from engine.domain.audit import tenant_chain
from engine.domain.errors import InvalidInput
from engine.domain.schedule import ScheduleOrigin
from engine.domain.timeutil import MINUTE_MS
from tests.conftest import T0, run_cli

SOURCE = "tests.static_overrides"


def declared(name: str = "nightly", *, paused: bool = False, every: int = 1) -> StaticSchedule:
    spec = ScheduleSpec(name, IntervalTrigger(every * MINUTE_MS, T0), "noop")
    return StaticSchedule(spec, SOURCE, paused)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def engine(tmp_path: Path, clock: ManualClock) -> Iterator[Engine]:
    with open_engine(tmp_path / "vortos.db", clock=clock) as opened:
        yield opened


def deploy(engine: Engine, *items: StaticSchedule) -> None:
    engine.service.sync_static(list(items), actor="deployer")


def stored(engine: Engine, name: str = "nightly") -> ScheduleSpec | object:
    return engine.service.get(name)


def last_event(engine: Engine) -> tuple[str, str, dict[str, object]]:
    entry = engine.storage.audit.latest(tenant_chain("default"), limit=1)[0]
    return entry.event, entry.actor, dict(entry.data)


def test_a_paused_static_schedule_stays_paused_across_deploys_until_resumed(
    engine: Engine, clock: ManualClock
) -> None:
    deploy(engine, declared())
    paused = engine.service.pause("nightly", actor="olga", note="incident 42")
    assert paused.override is not None
    assert (paused.override.state, paused.override.by, paused.override.note) == (
        ScheduleStatus.PAUSED,
        "olga",
        "incident 42",
    )
    event, actor, data = last_event(engine)
    assert (event, actor, data["override"], data["note"]) == (
        "schedule.paused",
        "olga",
        "paused",
        "incident 42",
    )
    deploy(engine, declared(every=5))  # a new release changes the schedule
    after = engine.service.get("nightly")
    assert after.status is ScheduleStatus.PAUSED
    assert after.trigger == IntervalTrigger(5 * MINUTE_MS, T0)
    assert after.override == paused.override
    clock.advance(3600)
    resumed = engine.service.resume("nightly", actor="olga")
    assert resumed.status is ScheduleStatus.ACTIVE
    assert resumed.override is None  # the code declares it active: nothing left to override
    assert resumed.next_slot_at is not None
    assert resumed.next_slot_at > clock.now_ms() - 1  # what was missed while paused does not fire
    assert last_event(engine)[2]["override"] == "cleared"


def test_a_schedule_the_code_declares_paused_can_be_force_resumed_and_returned(
    engine: Engine, clock: ManualClock
) -> None:
    deploy(engine, declared(paused=True))
    first = engine.service.get("nightly")
    assert (first.status, first.declared_paused, first.override) == (
        ScheduleStatus.PAUSED,
        True,
        None,
    )
    assert first.pause_note == "declared paused in code"
    forced = engine.service.resume("nightly", actor="olga")
    assert forced.status is ScheduleStatus.ACTIVE
    assert forced.override is not None
    assert forced.override.state is ScheduleStatus.ACTIVE
    assert last_event(engine)[2]["override"] == "active"
    deploy(engine, declared(paused=True))  # the next deploy still declares it paused
    assert engine.service.get("nightly").status is ScheduleStatus.ACTIVE
    cleared = engine.service.clear_override("nightly", actor="olga")
    assert (cleared.status, cleared.override) == (ScheduleStatus.PAUSED, None)
    event, actor, data = last_event(engine)
    assert (event, actor, data["status"]) == ("schedule.override_cleared", "olga", "paused")


def test_without_an_override_the_code_decides_and_unpausing_fires_from_now(
    engine: Engine, clock: ManualClock
) -> None:
    deploy(engine, declared(paused=True))
    clock.advance(3600)
    deploy(engine, declared(paused=False))
    now_active = engine.service.get("nightly")
    assert now_active.status is ScheduleStatus.ACTIVE
    assert now_active.pause_note is None
    assert now_active.next_slot_at is not None
    assert now_active.next_slot_at >= clock.now_ms()
    deploy(engine, declared(paused=True))
    assert engine.service.get("nightly").status is ScheduleStatus.PAUSED


def test_clearing_an_operators_pause_returns_the_schedule_to_its_code(
    engine: Engine, clock: ManualClock
) -> None:
    deploy(engine, declared())
    engine.service.pause("nightly", actor="olga")
    clock.advance(600)
    back = engine.service.clear_override("nightly", actor="olga")
    assert (back.status, back.override) == (ScheduleStatus.ACTIVE, None)
    assert back.next_slot_at is not None
    assert back.next_slot_at >= clock.now_ms()
    again = engine.service.clear_override("nightly", actor="olga")
    assert again.version == back.version  # nothing to clear: nothing changes


def test_bad_override_requests_are_refused_and_change_nothing(engine: Engine) -> None:
    engine.service.create(
        ScheduleSpec("adhoc", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="olga"
    )
    with pytest.raises(InvalidInput, match="is dynamic"):
        engine.service.clear_override("adhoc", actor="olga")
    deploy(engine, declared())
    engine.service.pause("nightly", actor="olga")
    deploy(engine)  # undeclared: disabled, the override kept for when it returns
    gone = engine.service.get("nightly")
    assert gone.status is ScheduleStatus.DISABLED
    for verb in (engine.service.pause, engine.service.resume):
        with pytest.raises(Conflict, match="no longer declared"):
            verb("nightly", actor="olga")
    assert engine.service.get("nightly") == gone
    deploy(engine, declared())  # declared again: the operator's pause still holds
    assert engine.service.get("nightly").status is ScheduleStatus.PAUSED


def test_activating_a_sensitive_static_schedule_waits_for_a_second_operator(
    tmp_path: Path, clock: ManualClock
) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=clock) as trusted:
        items = [declared(paused=True), declared("daily")]
        trusted.service.sync_static(
            [replace(i, spec=replace(i.spec, sensitive=True)) for i in items], actor="deployer"
        )
        trusted.storage.operators.grant(Grant("olga", Role.OPERATOR), by="setup", at=T0)
        trusted.storage.operators.grant(Grant("bea", Role.APPROVER), by="setup", at=T0)
    with open_engine(db, clock=clock, enforce=True) as governed:
        with pytest.raises(ApprovalRequired) as waiting:
            governed.service.resume("nightly", actor="olga")
        assert governed.service.get("nightly", actor="olga").status is ScheduleStatus.PAUSED
        governed.service.approve(waiting.value.approval.id, actor="bea")
        assert governed.service.resume("nightly", actor="olga").status is ScheduleStatus.ACTIVE
        governed.service.pause("nightly", actor="olga")
        # Clearing that pause returns it to the code's pause: nothing to approve.
        assert governed.service.clear_override("nightly", actor="olga").override is None
        governed.service.pause("daily", actor="olga")
        with pytest.raises(ApprovalRequired):  # clearing this one would activate it
            governed.service.clear_override("daily", actor="olga")
        assert governed.service.get("daily", actor="olga").status is ScheduleStatus.PAUSED


def test_a_static_schedule_paused_before_overrides_existed_keeps_its_pause(
    tmp_path: Path, clock: ManualClock
) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=clock) as engine:
        deploy(engine, declared())
        engine.service.pause("nightly", actor="olga", note="old pause")
    conn = apsw.Connection(str(db))  # the database as version 7 left it
    # What version 13 added besides its rebuilds (12 and 13 rebuild schedules and runs by named
    # columns): the node registry, the time limit and the fire's budgets. First, because
    # SQLite re-checks every trigger when a column goes, and those below name tables dropped
    # after it.
    conn.execute(
        "DROP TABLE nodes; ALTER TABLE schedules DROP COLUMN timeout_ms; "
        "ALTER TABLE fire_queue DROP COLUMN failures; "
        "ALTER TABLE fire_queue DROP COLUMN abandoned_at_requeue"
    )
    conn.execute("ALTER TABLE schedules DROP COLUMN override")
    conn.execute("ALTER TABLE schedules DROP COLUMN declared_paused")
    # What version 11 added (the audit chain at scale), which 8..10 do not touch.
    conn.execute(
        "DROP INDEX audit_entries_transitions; ALTER TABLE audit_entries DROP COLUMN seal; "
        "DROP TRIGGER runs_id_floor; DROP TABLE run_id_floor; DROP TABLE audit_identity; "
        "DROP TABLE audit_keys; DROP TABLE audit_chains; DROP TABLE audit_anchors"
    )
    conn.execute("PRAGMA user_version = 7")
    conn.close()
    with open_engine(db, clock=clock) as engine:
        upgraded = engine.service.get("nightly")
        assert upgraded.override is not None
        assert upgraded.override.state is ScheduleStatus.PAUSED
        assert upgraded.override.note == "old pause"
        deploy(engine, declared())
        assert engine.service.get("nightly").status is ScheduleStatus.PAUSED


def test_the_cli_shows_the_override_and_clears_it(tmp_path: Path, clock: ManualClock) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=clock) as engine:
        deploy(engine, declared())
    paused = run_cli("schedule", "pause", "nightly", "--note", "incident", db=db)
    assert paused.code == 0, paused.stderr
    assert "an override of its code, which declares it active" in paused.stderr
    listed = run_cli("schedule", "list", db=db)
    assert "paused (override)" in listed.stdout
    shown = run_cli("schedule", "show", "nightly", db=db)
    assert re.search(r"declared\s+active \(in code\)", shown.stdout)
    assert re.search(r"override\s+paused by", shown.stdout)
    assert ": incident" in shown.stdout
    as_json = json.loads(run_cli("schedule", "show", "nightly", "--json", db=db).stdout)
    assert as_json["declared_status"] == "active"
    assert as_json["override"]["state"] == "paused"
    cleared = run_cli("schedule", "clear-override", "nightly", db=db)
    assert cleared.code == 0, cleared.stderr
    assert "is active, as its code declares" in cleared.stderr
    assert (
        json.loads(run_cli("schedule", "show", "nightly", "--json", db=db).stdout)["override"]
        is None
    )
    dynamic = run_cli("schedule", "add", "adhoc", "--every", "1m", "--command", "noop", db=db)
    assert dynamic.code == 0, dynamic.stderr
    refused = run_cli("schedule", "clear-override", "adhoc", db=db)
    assert refused.code == 2
    assert "is dynamic" in refused.stderr
    with open_engine(db, clock=clock) as engine:
        assert engine.service.get("adhoc").origin is ScheduleOrigin.DYNAMIC
