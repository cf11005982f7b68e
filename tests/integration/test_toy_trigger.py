"""A trigger type is one class plus one registration: nothing in storage, the wire, the audit
trail or the daemon lists the kinds (the schedules table keeps the kind as data)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine import ManualClock, ScheduleSpec, open_engine
from engine.control.codec import from_wire, to_wire
from engine.domain.errors import InvalidInput, StorageError
from engine.domain.timeutil import MINUTE_MS
from engine.domain.triggers import (
    trigger_from_json,
    trigger_kinds,
    trigger_to_json,
)
from engine.domain.values import JsonValue
from engine.extend import Slot, register_trigger
from engine.ports.runs import RunQuery
from engine.service.core import definition
from tests.conftest import T0


@dataclass(frozen=True, slots=True)
class Squares:
    """A toy: slots at the anchor plus k*k minutes, k = 1, 2, 3, ..."""

    anchor_ms: int
    kind: str = field(default="toy_squares", init=False)

    def slot_after(self, after_ms: int, tz: str) -> Slot | None:
        k = 1
        while self.anchor_ms + k * k * MINUTE_MS <= after_ms:
            k += 1
        return Slot(self.anchor_ms + k * k * MINUTE_MS)

    def to_spec(self) -> dict[str, JsonValue]:
        return {"anchor_ms": self.anchor_ms}

    def describe(self) -> str:
        return "at square minutes"


def _squares(spec: Mapping[str, JsonValue]) -> Squares:
    anchor = spec["anchor_ms"]
    assert isinstance(anchor, int)
    return Squares(anchor)


register_trigger("toy_squares", _squares)


def test_a_registered_trigger_is_stored_read_dispatched_and_audited(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        made = engine.service.create(ScheduleSpec("squares", Squares(T0), "noop"), actor="op")
        assert made.next_slot_at == T0 + MINUTE_MS
        daemon = engine.daemon(node_id="n1", lookahead_ms=0)
        for count in (1, 2, 3):
            clock.set(engine.service.get("squares").next_fire_at or 0)
            for _ in range(5):  # a jump of minutes outlives the lease: a step leads again
                daemon.step()
                if len(engine.service.runs(RunQuery(schedule_id=made.id))) == count:
                    break
        runs = engine.service.runs(RunQuery(schedule_id=made.id))
        fired = sorted(r.slot_at for r in runs)
        assert fired == [T0 + MINUTE_MS, T0 + 4 * MINUTE_MS, T0 + 9 * MINUTE_MS]
        created = [
            e
            for e in engine.storage.audit.entries("tenant:default")
            if e.event == "schedule.created"
        ]
        assert created[0].data["definition"]["trigger"] == {"kind": "toy_squares", "anchor_ms": T0}
    with open_engine(db, clock=clock) as again:
        stored = again.service.get("squares")
        assert stored.trigger == Squares(T0)
        assert definition(stored)["trigger"] == trigger_to_json(Squares(T0))


def test_the_wire_and_json_carry_it_with_no_change_there() -> None:
    assert "toy_squares" in trigger_kinds()
    assert trigger_from_json(trigger_to_json(Squares(T0))) == Squares(T0)
    spec = ScheduleSpec("squares", Squares(T0), "noop")
    assert ScheduleSpec.from_json(spec.to_json()) == spec
    assert from_wire(ScheduleSpec, to_wire(spec)) == spec


def test_a_kind_nobody_registered_is_refused_by_name() -> None:
    with pytest.raises(InvalidInput, match="unknown trigger kind 'toy_cubes'"):
        trigger_from_json({"kind": "toy_cubes", "anchor_ms": 0})
    with pytest.raises(ValueError, match="already registered"):
        register_trigger("cron", _squares)


def test_a_stored_kind_this_process_does_not_know_names_itself(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        engine.service.create(ScheduleSpec("squares", Squares(T0), "noop"), actor="op")
    import apsw  # noqa: PLC0415

    conn = apsw.Connection(str(db))
    conn.execute("UPDATE schedules SET trigger_kind = 'toy_cubes' WHERE name = 'squares'")
    conn.close()
    with open_engine(db, clock=ManualClock(T0)) as engine, pytest.raises(StorageError) as found:
        engine.service.get("squares")
    assert "toy_cubes" in str(found.value)
