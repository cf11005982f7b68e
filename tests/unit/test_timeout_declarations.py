"""Time limits as declared: @schedulable(timeout=), @scheduled(timeout=), a schedule's own
timeout_ms in its definition and in an edit."""

from __future__ import annotations

import math

import pytest

from engine import FireContext, schedulable, scheduled
from engine.commands.decorators import command_of, schedules_of
from engine.domain.errors import InvalidInput
from engine.domain.patch import SchedulePatch, apply_patch
from engine.domain.schedule import ScheduleSpec, validate_timeout
from engine.domain.triggers import IntervalTrigger


def test_a_command_and_its_static_schedule_declare_their_limits() -> None:
    @scheduled(every="1m", timeout="5s")
    @schedulable(timeout=2.5)
    def job(*, fire: FireContext) -> None: ...

    command = command_of(job)
    assert command is not None
    assert command.timeout_ms == 2_500
    assert schedules_of(job)[0].spec.timeout_ms == 5_000


def test_a_command_without_a_timeout_has_no_limit() -> None:
    @schedulable
    def job() -> None: ...

    command = command_of(job)
    assert command is not None
    assert command.timeout_ms is None


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("0s", "out of range"),
        (-1, "out of range"),
        (math.nan, "out of range"),
        ("8d", "at most 7d"),
        # Past any duration's bound: still the time limit's bound (it said 3660d).
        ("3661d", "at most 7d"),
        ("-1s", "negative"),
        ("soon", "soon"),
        (True, "must be a duration"),
    ],
)
def test_a_bad_command_timeout_is_refused_at_import(given: object, words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        schedulable(timeout=given)  # type: ignore[call-overload]


def test_validate_timeout_takes_none_and_refuses_what_is_out_of_range() -> None:
    assert validate_timeout(None) is None
    assert validate_timeout(1) == 1
    with pytest.raises(InvalidInput, match=r"timeout_ms=.*out of range"):
        validate_timeout(0)
    with pytest.raises(InvalidInput, match="must be a duration"):
        validate_timeout("5s")  # type: ignore[arg-type]


def test_a_definition_spells_its_timeout_only_when_it_has_one() -> None:
    plain = ScheduleSpec(name="a", trigger=IntervalTrigger(60_000, 0), command="noop")
    assert "timeout_ms" not in plain.to_json()  # as before time limits: no audit churn
    limited = ScheduleSpec(
        name="a", trigger=IntervalTrigger(60_000, 0), command="noop", timeout_ms=30_000
    )
    assert limited.to_json()["timeout_ms"] == 30_000
    assert ScheduleSpec.from_json(limited.to_json()) == limited
    assert ScheduleSpec.from_json(plain.to_json()) == plain


def test_an_edit_sets_changes_or_removes_the_timeout_and_leaves_it_otherwise() -> None:
    spec = ScheduleSpec(name="a", trigger=IntervalTrigger(60_000, 0), command="noop")
    limited = apply_patch(spec, SchedulePatch(timeout_ms=2_000), 0)
    assert limited.timeout_ms == 2_000
    assert apply_patch(limited, SchedulePatch(jitter_ms=5), 0).timeout_ms == 2_000
    assert apply_patch(limited, SchedulePatch(timeout_ms=0), 0).timeout_ms is None
    with pytest.raises(InvalidInput, match="timeout_ms= must be a whole number"):
        SchedulePatch(timeout_ms="2s")  # type: ignore[arg-type]
