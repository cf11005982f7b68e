"""Acceptance 1 through the service itself: for each operation and each role (held in every
tenant), the service call that performs the operation is allowed or refused as the README's
table says, and a refusal changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine import (
    Engine,
    IntervalTrigger,
    ManualClock,
    RunState,
    ScheduleSpec,
    open_engine,
)
from engine.domain.access import ANY_TENANT, Grant, Operation, PermissionDenied, Role
from engine.domain.approvals import ApprovalRequired
from engine.domain.audit import tenant_chain
from engine.domain.timeutil import MINUTE_MS
from engine.ports.fire_queue import Outcome, Settlement
from engine.ports.runs import RunQuery
from engine.ports.schedules import ScheduleQuery
from tests.conftest import T0
from tests.unit.test_role_matrix import MATRIX

WHO = "alice"


@dataclass
class Setup:
    engine: Engine
    dead_run: int
    approval_id: str


def spec(name: str, **changes: object) -> ScheduleSpec:
    return ScheduleSpec(
        name,
        IntervalTrigger(MINUTE_MS, T0),
        "noop",
        tenant="acme",
        **changes,  # type: ignore[arg-type]
    )


CALLS: dict[Operation, Callable[[Setup], object]] = {
    Operation.VIEW: lambda s: s.engine.service.get("report", tenant="acme", actor=WHO),
    Operation.CREATE: lambda s: s.engine.service.create(spec("fresh"), actor=WHO),
    Operation.UPDATE: lambda s: s.engine.service.update(
        spec("report", metadata={"k": "v"}), actor=WHO
    ),
    Operation.PAUSE: lambda s: s.engine.service.pause("report", actor=WHO, tenant="acme"),
    Operation.RESUME: lambda s: s.engine.service.resume("idle", actor=WHO, tenant="acme"),
    Operation.DELETE: lambda s: s.engine.service.delete("report", actor=WHO, tenant="acme"),
    Operation.TRIGGER: lambda s: s.engine.service.trigger("report", actor=WHO, tenant="acme"),
    Operation.BACKFILL: lambda s: s.engine.service.backfill(
        "report", start_ms=T0, end_ms=T0 + 2 * MINUTE_MS, actor=WHO, tenant="acme"
    ),
    Operation.REQUEUE: lambda s: s.engine.service.requeue([s.dead_run], actor=WHO, tenant="acme"),
    Operation.APPROVE: lambda s: s.engine.service.approve(s.approval_id, actor=WHO),
    Operation.MANAGE_OPERATORS: lambda s: s.engine.service.grant_role(
        "carol", Role.VIEWER, actor=WHO, tenant="acme"
    ),
}
# Retention joins with its issue; it has no service call yet.
PENDING = {Operation.MANAGE_RETENTION}


def _setup(db: Path, role: Role) -> None:
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as trusted:
        service = trusted.service
        service.create(spec("report"), actor="setup")
        service.create(spec("idle"), actor="setup")
        service.pause("idle", actor="setup", tenant="acme")
        service.create(spec("payroll", sensitive=True), actor="setup")
        dead = service.trigger("report", actor="setup", tenant="acme")
        claim = trusted.storage.fire_queue.claim(consumer="c", ttl_ms=60_000, limit=1)
        trusted.storage.fire_queue.settle(
            claim.token, "c", [Settlement(dead.id, Outcome.DISCARD, RunState.DEAD_LETTERED)]
        )
        for who, granted in (("admin", Role.ADMIN), ("olga", Role.OPERATOR), (WHO, role)):
            trusted.storage.operators.grant(Grant(who, granted, ANY_TENANT), by="setup", at=T0)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[Role, Path]:
    """One seeded database per role, copied for each case (seeding is the slow part)."""
    found = {}
    for role in Role:
        db = tmp_path_factory.mktemp(role.value) / "vortos.db"
        _setup(db, role)
        found[role] = db
    return found


def _copy(source: Path, target: Path) -> Path:
    for suffix in ("", ".audit-key"):
        Path(f"{target}{suffix}").write_bytes(Path(f"{source}{suffix}").read_bytes())
    return target


def _state(engine: Engine) -> tuple[object, ...]:
    storage = engine.storage
    return (
        storage.schedules.count(),
        [s.version for s in storage.schedules.query(ScheduleQuery())],
        storage.runs.count(),
        storage.operators.count(),
        storage.audit.head(tenant_chain("acme")),
    )


CASES = sorted(
    ((op, role) for (op, role) in MATRIX if op not in PENDING), key=lambda c: (c[0], c[1])
)


@pytest.mark.parametrize(("operation", "role"), CASES, ids=str)
def test_each_operation_is_allowed_to_each_role_exactly_as_the_readme_says(
    prepared: dict[Role, Path], tmp_path: Path, operation: Operation, role: Role
) -> None:
    db = _copy(prepared[role], tmp_path / "vortos.db")
    with open_engine(db, clock=ManualClock(T0 + 10 * MINUTE_MS), enforce=True) as engine:
        approval_id = ""
        if operation is Operation.APPROVE:
            with pytest.raises(ApprovalRequired) as waiting:
                engine.service.trigger("payroll", actor="olga", tenant="acme")
            approval_id = waiting.value.approval.id
        setup = Setup(
            engine,
            engine.storage.runs.query(RunQuery(limit=1))[0].id,
            approval_id,
        )
        before = _state(engine)
        if MATRIX[(operation, role)]:
            CALLS[operation](setup)
        else:
            with pytest.raises(PermissionDenied, match=f"{WHO} may not {operation.value}"):
                CALLS[operation](setup)
            assert _state(engine) == before


def test_every_operation_but_the_pending_ones_has_a_service_call() -> None:
    assert set(CALLS) | PENDING == set(Operation)
