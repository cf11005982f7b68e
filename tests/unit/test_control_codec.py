"""The control socket's codec: every domain value a read answers with comes back equal, and a
value that does not fit its type is a ProtocolError naming where, never a half-built value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.control.codec import from_wire, to_wire
from engine.control.wire import ProtocolError
from engine.domain.approvals import Approval, ApprovalState, GatedOperation
from engine.domain.audit import AuditEntry, tenant_chain
from engine.domain.run import Run
from engine.domain.schedule import Schedule
from engine.domain.timeutil import MINUTE_MS
from engine.ports.read_model import Page, ScheduleRow
from engine.ports.runs import RunQuery
from tests.conftest import T0


def wire_round_trip(kind: Any, value: Any) -> Any:
    return from_wire(kind, json.loads(json.dumps(to_wire(value))))


@pytest.fixture
def values(tmp_path: Path) -> dict[str, Any]:
    with open_engine(tmp_path / "vortos.db", clock=ManualClock(T0)) as engine:
        made = engine.service.create(
            ScheduleSpec(
                "report",
                IntervalTrigger(MINUTE_MS, T0 + MINUTE_MS),
                "echo",
                payload={"to": ["ops"], "n": 2, "deep": {"a": None}},
                tenant="acme",
                metadata={"owner": "ops"},
            ),
            actor="setup",
        )
        engine.service.trigger("report", actor="setup", tenant="acme")
        runs = engine.storage.runs.query(RunQuery(tenant="acme", limit=10))
        entries = engine.storage.audit.entries(tenant_chain("acme"))
    approval = Approval(
        id="a1",
        tenant="acme",
        schedule="report",
        operation=GatedOperation.TRIGGER,
        digest="d" * 64,
        change={"schedule_id": made.id, "version": 1},
        requested_by="olga",
        requested_at=T0,
        expires_at=T0 + MINUTE_MS,
        stored_state=ApprovalState.PENDING,
    )
    return {"schedule": made, "runs": runs, "entries": entries, "approval": approval}


def test_domain_values_come_back_equal(values: dict[str, Any]) -> None:
    assert wire_round_trip(Schedule, values["schedule"]) == values["schedule"]
    assert wire_round_trip(list[Run], values["runs"]) == values["runs"]
    assert wire_round_trip(list[AuditEntry], values["entries"]) == values["entries"]
    assert wire_round_trip(Approval, values["approval"]) == values["approval"]


def test_a_generic_page_comes_back_with_its_rows_typed(values: dict[str, Any]) -> None:
    page = Page(rows=(ScheduleRow(values["schedule"], ()),), offset=0, total=1, more=False)
    back = wire_round_trip(Page[ScheduleRow], page)
    assert back == page
    assert isinstance(back.rows[0].schedule, Schedule)


def test_a_value_that_does_not_fit_names_where(values: dict[str, Any]) -> None:
    sent = to_wire(values["runs"])
    sent[0]["attempts"] = "three"
    with pytest.raises(ProtocolError, match=r"list\[0\]\.attempts: 'three' is not an integer"):
        from_wire(list[Run], sent)
    broken = to_wire(values["schedule"])
    broken["trigger"] = {"every_ms": 60_000}
    with pytest.raises(ProtocolError, match=r"Schedule\.trigger: not a trigger"):
        from_wire(Schedule, broken)
    with pytest.raises(ProtocolError, match=r"Approval\.stored_state: 'maybe' is not"):
        from_wire(Approval, {**to_wire(values["approval"]), "stored_state": "maybe"})
    with pytest.raises(ProtocolError, match="Schedule: not an object"):
        from_wire(Schedule, [1, 2])
