"""Four-eyes follows what is protected: a command declared sensitive in code
(`@schedulable(sensitive=True)`) or by the owner's settings (`sensitive_commands`) gates every
schedule that runs it, whatever the schedule's own flag; and an approval binds to the change as
its requester wrote it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import (
    CommandRegistry,
    Engine,
    IntervalTrigger,
    ManualClock,
    ScheduleSpec,
    builtin_commands,
    open_engine,
    schedulable,
)
from engine.commands.decorators import StaticSchedule, command_of
from engine.domain.access import Role
from engine.domain.approvals import ApprovalRequired, ApprovalState
from engine.domain.errors import InvalidInput
from engine.domain.run import RunState
from engine.domain.schedule import MisfireKind, MisfirePolicy, ScheduleOrigin
from engine.domain.timeutil import HOUR_MS
from engine.ports.fire_queue import Outcome, Settlement
from engine.service.core import new_schedule
from tests.conftest import T0, run_cli


@schedulable("pay-salaries", sensitive=True)
def pay_salaries(month: str = "") -> None:
    """Pays everyone."""


def registry() -> CommandRegistry:
    commands = builtin_commands()
    found = command_of(pay_salaries)
    assert found is not None
    commands.add(found)
    return commands


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def governed(tmp_path: Path, clock: ManualClock) -> Iterator[Engine]:
    with open_engine(
        tmp_path / "vortos.db", clock=clock, enforce=True, commands=registry()
    ) as engine:
        engine.service.grant_role("olga", Role.OPERATOR, actor="admin", tenant="acme")
        engine.service.grant_role("otto", Role.OPERATOR, actor="admin", tenant="acme")
        engine.service.grant_role("bea", Role.APPROVER, actor="admin", tenant="acme")
        yield engine


def spec(name: str, command: str = "pay-salaries", **extra: object) -> ScheduleSpec:
    return ScheduleSpec(
        name,
        IntervalTrigger(HOUR_MS, T0 + HOUR_MS),
        command,
        tenant="acme",
        **extra,  # type: ignore[arg-type]
    )


def waits(call: object) -> str:
    with pytest.raises(ApprovalRequired) as waiting:
        call()  # type: ignore[operator]
    return waiting.value.approval.id


def test_schedulable_declares_a_command_sensitive() -> None:
    found = command_of(pay_salaries)
    assert found is not None
    assert found.sensitive
    assert registry().sensitivity("pay-salaries") == (
        f"in code ({pay_salaries.__module__}.pay_salaries)"
    )
    assert registry().sensitivity("noop") is None


def test_creating_a_schedule_of_a_sensitive_command_waits_whatever_its_flag(
    governed: Engine,
) -> None:
    asked = waits(lambda: governed.service.create(spec("pay"), actor="olga"))
    with pytest.raises(ApprovalRequired) as again:
        governed.service.create(spec("pay"), actor="olga")
    assert again.value.approval.id == asked
    assert "its command 'pay-salaries' is declared sensitive in code" in str(again.value)
    assert governed.service.schedules(tenant="acme", actor="olga") == []
    governed.service.approve(asked, actor="bea")
    made = governed.service.create(spec("pay"), actor="olga")
    assert made.sensitive  # stored so: a process without the app sees it too


def test_the_owners_setting_protects_a_command_the_code_does_not(
    tmp_path: Path, clock: ManualClock
) -> None:
    commands = registry()
    commands.protect(["echo"])
    with open_engine(tmp_path / "v.db", clock=clock, enforce=True, commands=commands) as engine:
        engine.service.grant_role("olga", Role.OPERATOR, actor="admin", tenant="acme")
        waits(lambda: engine.service.create(spec("shout", "echo"), actor="olga"))
        engine.service.create(spec("quiet", "noop"), actor="olga")  # not protected


def test_an_approval_cannot_be_used_by_another_operator(governed: Engine) -> None:
    asked = waits(lambda: governed.service.create(spec("pay"), actor="olga"))
    governed.service.approve(asked, actor="bea")
    other = waits(lambda: governed.service.create(spec("pay"), actor="otto"))
    assert other != asked
    assert governed.service.approval(asked, actor="bea").state_at(T0) is ApprovalState.APPROVED
    governed.service.create(spec("pay"), actor="olga")
    assert governed.service.approval(asked, actor="bea").state_at(T0) is (ApprovalState.CONSUMED)


def test_an_open_interval_anchor_is_fixed_in_the_request(
    governed: Engine, clock: ManualClock
) -> None:
    """An --every without --start: each retry computes a new "one period from now"; the
    request binds to the change as written and the change made is the one approved."""

    def unanchored() -> ScheduleSpec:
        now = clock.now_ms()
        return ScheduleSpec(
            "pay",
            IntervalTrigger(HOUR_MS, now + HOUR_MS, anchored=False),
            "pay-salaries",
            tenant="acme",
        )

    asked = waits(lambda: governed.service.create(unanchored(), actor="olga"))
    clock.advance(7 * 60)
    assert waits(lambda: governed.service.create(unanchored(), actor="olga")) == asked
    governed.service.approve(asked, actor="bea")
    clock.advance(5 * 60)
    made = governed.service.create(unanchored(), actor="olga")
    assert isinstance(made.trigger, IntervalTrigger)
    assert made.trigger.anchor_ms == T0 + HOUR_MS  # as asked, not as retried
    assert made.next_slot_at == T0 + HOUR_MS


def test_a_schedule_of_a_sensitive_command_refuses_to_lose_its_flag(governed: Engine) -> None:
    asked = waits(lambda: governed.service.create(spec("pay"), actor="olga"))
    governed.service.approve(asked, actor="bea")
    governed.service.create(spec("pay"), actor="olga")
    with pytest.raises(InvalidInput, match="cannot be made not sensitive"):
        governed.service.update(spec("pay", sensitive=False), actor="olga")


def test_a_trigger_from_a_process_without_the_app_still_waits(
    tmp_path: Path, clock: ManualClock
) -> None:
    """The CLI run without --app does not know the command; the flag stored with the
    schedule (set because its command is sensitive) does."""
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=clock, commands=registry()) as trusted:
        made = trusted.service.create(spec("pay"), actor="setup")  # trusted: not gated
    assert made.sensitive
    result = run_cli("schedule", "trigger", "pay", "--tenant", "acme", db=db)
    assert result.code == 6, result.stderr
    assert "needs a second operator's approval" in result.stderr


# -- requeue: one more execution of what is protected --------------------------------------------


def dead_letter(engine: Engine, name: str) -> int:
    """A run of `name` dead-lettered (by trusted code: triggered, claimed, discarded)."""
    run = engine.service.trigger(name, actor="setup", tenant="acme")
    claim = engine.storage.fire_queue.claim(consumer="c", ttl_ms=60_000, limit=10)
    engine.storage.fire_queue.settle(
        claim.token, "c", [Settlement(run.id, Outcome.DISCARD, RunState.DEAD_LETTERED)]
    )
    return run.id


@pytest.fixture
def dead(tmp_path: Path, clock: ManualClock) -> Iterator[tuple[Engine, int, int]]:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=clock, commands=registry()) as trusted:
        trusted.service.create(spec("pay"), actor="setup")  # runs a sensitive command
        trusted.service.create(spec("report", "noop"), actor="setup")
        pay, report = dead_letter(trusted, "pay"), dead_letter(trusted, "report")
    with open_engine(db, clock=clock, enforce=True, commands=registry()) as engine:
        engine.service.grant_role("olga", Role.OPERATOR, actor="admin")
        engine.service.grant_role("bea", Role.APPROVER, actor="admin")
        yield engine, pay, report


def test_requeueing_a_protected_dead_letter_needs_an_approval(
    dead: tuple[Engine, int, int],
) -> None:
    engine, pay, report = dead
    assert engine.service.requeue([report], actor="olga", tenant="acme") == 1  # not protected
    asked = waits(lambda: engine.service.requeue([pay], actor="olga", tenant="acme"))
    assert [f.run_id for f in engine.service.dead_letters(tenant="acme", actor="olga")] == [pay]
    engine.service.approve(asked, actor="bea")
    assert engine.service.requeue([pay], actor="olga", tenant="acme") == 1
    assert engine.service.dead_letters(tenant="acme", actor="olga") == []


def test_requeue_all_refuses_to_carry_a_protected_dead_letter_along(
    dead: tuple[Engine, int, int],
) -> None:
    engine, pay, report = dead
    with pytest.raises(InvalidInput, match=rf"acme/pay \(runs {pay}\); requeue them by id"):
        engine.service.requeue(None, actor="olga", tenant="acme")
    assert {f.run_id for f in engine.service.dead_letters(tenant="acme", actor="olga")} == {
        pay,
        report,
    }


# -- what an approval covers, and static schedules ------------------------------------------------


def test_an_approval_covers_every_limit_of_the_misfire_policy(governed: Engine) -> None:
    """Found from the README alone: a create approved with a catch-up cap of 1 was applied
    with 10,000 and 30 days, because the request recorded the policy's kind only."""
    each = MisfirePolicy(MisfireKind.EACH, catch_up_cap=1)
    asked = waits(lambda: governed.service.create(spec("pay", misfire=each), actor="olga"))
    governed.service.approve(asked, actor="bea")
    wider = MisfirePolicy(MisfireKind.EACH, catch_up_cap=10_000, max_age_ms=30 * 86_400_000)
    other = waits(lambda: governed.service.create(spec("pay", misfire=wider), actor="olga"))
    assert other != asked
    made = governed.service.create(spec("pay", misfire=each), actor="olga")
    assert made.misfire == each


def test_an_edit_of_a_misfire_limit_alone_is_a_change(tmp_path: Path, clock: ManualClock) -> None:
    """Found from the README alone: `edit --catch-up-cap 3` said "nothing changed"."""
    with open_engine(tmp_path / "v.db", clock=clock) as trusted:
        trusted.service.create(
            spec("plain", "noop", misfire=MisfirePolicy(MisfireKind.EACH)), actor="setup"
        )
        limited = MisfirePolicy(MisfireKind.EACH, catch_up_cap=3, grace_ms=300_000)
        changed = trusted.service.update(spec("plain", "noop", misfire=limited), actor="setup")
        assert changed.misfire == limited
        assert changed.version == 2


def test_a_static_schedule_of_a_sensitive_command_is_stored_sensitive(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Found from the README alone: a static schedule was stored not sensitive, so a service
    restarted without --app let one operator trigger it."""
    db = tmp_path / "vortos.db"
    static = StaticSchedule(spec("payday"), "jobs.payday")
    with open_engine(db, clock=clock, commands=registry()) as trusted:
        trusted.service.sync_static([static], actor="app")
        assert trusted.service.get("payday", tenant="acme").sensitive
    result = run_cli("schedule", "trigger", "payday", "--tenant", "acme", db=db)  # no --app
    assert result.code == 6, result.stderr


def test_a_sync_marks_a_static_schedule_stored_before_as_sensitive(
    tmp_path: Path, clock: ManualClock
) -> None:
    db = tmp_path / "vortos.db"
    static = StaticSchedule(spec("payday"), "jobs.payday")
    with open_engine(db, clock=clock, commands=builtin_commands()) as before:
        before.storage.schedules.insert(
            new_schedule(spec("payday"), T0 + HOUR_MS, T0, ScheduleOrigin.STATIC)
        )
    with open_engine(db, clock=clock, commands=registry()) as trusted:
        assert trusted.service.sync_static([static], actor="app").updated == ["acme/payday"]
        assert trusted.service.get("payday", tenant="acme").sensitive
