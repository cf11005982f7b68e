"""Schedules and runs for the storage suites, built the way the service builds them, and the
suites' way of saying which guarantee an expected error stands for."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from engine.domain.misfire import due_at
from engine.domain.run import NewRun, RunKind
from engine.domain.schedule import (
    DEFAULT_TENANT,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleStatus,
)
from engine.domain.slots import slot_key
from engine.domain.timeutil import MINUTE_MS, parse_instant
from engine.domain.triggers import CronTrigger
from engine.ports.storage import Storage

E = TypeVar("E", bound=BaseException)

# When the builders' schedules were created; far from any DST transition.
CREATED_AT = parse_instant("2026-01-04T12:00:00Z")
# The first slot of the default trigger after CREATED_AT.
FIRST_SLOT = CREATED_AT + 5 * MINUTE_MS


def make_schedule(
    name: str = "nightly-report", *, tenant: str = DEFAULT_TENANT, **changes: Any
) -> Schedule:
    """A valid, freshly created schedule (version 1, active); `changes` replace any field."""
    schedule_id = uuid.uuid4().hex
    base = Schedule(
        id=schedule_id,
        tenant=tenant,
        name=name,
        trigger=CronTrigger("*/5 * * * *"),
        timezone="UTC",
        command="noop",
        payload={},
        misfire=MisfirePolicy(),
        overlap=OverlapPolicy.SKIP,
        jitter_ms=0,
        status=ScheduleStatus.ACTIVE,
        sensitive=False,
        metadata={},
        version=1,
        next_slot_at=FIRST_SLOT,
        next_fire_at=due_at(schedule_id, FIRST_SLOT, "UTC", 0),
        created_at=CREATED_AT,
        updated_at=CREATED_AT,
    )
    return replace(base, **changes)


def stored_schedule(
    storage: Storage, name: str = "nightly-report", *, tenant: str = DEFAULT_TENANT, **changes: Any
) -> Schedule:
    """A schedule inserted into `storage`'s schedule store."""
    return storage.schedules.insert(make_schedule(name, tenant=tenant, **changes))


def make_run(
    schedule: Schedule,
    slot_at: int,
    *,
    tenant: str | None = None,
    node_id: str = "node-a",
    kind: RunKind = RunKind.SCHEDULED,
) -> NewRun:
    """The run of `schedule`'s slot at `slot_at` (in `tenant`, when given, else the schedule's)."""
    return NewRun(
        tenant=schedule.tenant if tenant is None else tenant,
        schedule_id=schedule.id,
        schedule_name=schedule.name,
        slot_key=slot_key(schedule.id, slot_at, schedule.timezone),
        slot_at=slot_at,
        due_at=due_at(schedule.id, slot_at, schedule.timezone, schedule.jitter_ms),
        kind=kind,
        node_id=node_id,
    )


@contextmanager
def must_raise(
    expected: type[E], guarantee: str, *, match: str | None = None
) -> Iterator[pytest.ExceptionInfo[E]]:
    """`pytest.raises`, whose failure names the guarantee the error stands for: a store that
    raises nothing fails with `guarantee`, one that raises something else carries it as a
    note on that error."""
    __tracebackhide__ = True  # a failure points at the suite's line, not at this helper
    try:
        # The caller's block runs at the yield; the fail after it is reached only when that
        # block raised nothing.
        with pytest.raises(expected, match=match) as raised:  # noqa: PT012
            yield raised
            pytest.fail(f"{guarantee} (nothing was raised)")
    except Exception as other:
        # Not the error the port promises (or its message did not match): the traceback is
        # the user's best clue, so keep it and only add what was expected.
        other.add_note(f"expected {expected.__name__}: {guarantee}")
        raise
