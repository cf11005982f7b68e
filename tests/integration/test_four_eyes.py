"""Four-eyes through the service with access control on (as the CLI and the console run it):
a sensitive change waits for someone else's approval, runs once, exactly as approved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import (
    Conflict,
    Engine,
    IntervalTrigger,
    ManualClock,
    NotFound,
    ScheduleSpec,
    open_engine,
)
from engine.domain.access import PermissionDenied, Role
from engine.domain.approvals import ApprovalRequired, ApprovalState
from engine.domain.audit import tenant_chain
from engine.domain.errors import InvalidInput
from engine.domain.run import RunKind
from engine.domain.timeutil import DAY_MS, MINUTE_MS
from engine.ports.runs import RunQuery
from tests.conftest import T0, run_cli


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def governed(tmp_path: Path, clock: ManualClock) -> Iterator[Engine]:
    """'payroll' (sensitive) and 'report' in acme; olga operates acme, bea approves acme,
    vera views acme."""
    with open_engine(tmp_path / "vortos.db", clock=clock) as trusted:
        # Set-up by trusted code: no roles, no four-eyes.
        for name, sensitive in (("payroll", True), ("report", False)):
            trusted.service.create(
                ScheduleSpec(
                    name,
                    IntervalTrigger(MINUTE_MS, T0 + MINUTE_MS),
                    "noop",
                    tenant="acme",
                    sensitive=sensitive,
                ),
                actor="setup",
            )
    with open_engine(tmp_path / "vortos.db", clock=clock, enforce=True) as engine:
        engine.service.grant_role("olga", Role.OPERATOR, actor="admin", tenant="acme")
        engine.service.grant_role("bea", Role.APPROVER, actor="admin", tenant="acme")
        engine.service.grant_role("vera", Role.VIEWER, actor="admin", tenant="acme")
        yield engine


def manual_runs(engine: Engine) -> int:
    runs = engine.service.runs(RunQuery(tenant="acme", limit=1000), actor="vera")
    return sum(1 for r in runs if r.kind is RunKind.MANUAL)


def ask(engine: Engine, actor: str = "olga") -> str:
    with pytest.raises(ApprovalRequired) as waiting:
        engine.service.trigger("payroll", actor=actor, tenant="acme")
    assert "needs a second operator's approval" in str(waiting.value)
    return waiting.value.approval.id


def test_a_sensitive_trigger_waits_and_asking_again_is_the_same_request(governed: Engine) -> None:
    first = ask(governed)
    assert ask(governed) == first
    assert manual_runs(governed) == 0
    assert governed.service.approval(first, actor="bea").state_at(T0) is ApprovalState.PENDING


def test_a_schedule_that_is_not_sensitive_needs_no_approval(governed: Engine) -> None:
    governed.service.trigger("report", actor="olga", tenant="acme")
    assert manual_runs(governed) == 1


def test_approved_by_another_the_change_runs_once_and_a_second_use_asks_again(
    governed: Engine,
) -> None:
    request = ask(governed)
    with pytest.raises(PermissionDenied, match=r"olga asked for .* cannot approve it"):
        governed.service.approve(request, actor="olga")
    with pytest.raises(PermissionDenied, match="needs the approver role"):
        governed.service.approve(request, actor="vera")
    governed.service.approve(request, actor="bea")
    governed.service.trigger("payroll", actor="olga", tenant="acme")
    assert manual_runs(governed) == 1
    assert governed.service.approval(request, actor="bea").stored_state is ApprovalState.CONSUMED
    again = ask(governed)
    assert again != request
    assert manual_runs(governed) == 1
    events = [
        e.event for e in reversed(governed.storage.audit.latest(tenant_chain("acme"), limit=5))
    ]
    assert events[-5:] == [
        "approval.requested",
        "approval.approved",
        "approval.consumed",
        "fire.manual",
        "approval.requested",
    ]


def test_an_approval_allows_exactly_the_approved_change(governed: Engine) -> None:
    request = ask(governed)
    governed.service.approve(request, actor="bea")
    governed.service.pause("payroll", actor="olga", tenant="acme")  # version moves on
    with pytest.raises(ApprovalRequired) as waiting:
        governed.service.trigger("payroll", actor="olga", tenant="acme")
    assert waiting.value.approval.id != request
    assert manual_runs(governed) == 0


def test_an_expired_request_cannot_be_approved_and_an_expired_approval_is_not_used(
    governed: Engine, clock: ManualClock
) -> None:
    stale = ask(governed)
    clock.advance(DAY_MS // 1000)
    with pytest.raises(Conflict, match=f"approval {stale} is expired"):
        governed.service.approve(stale, actor="bea")
    fresh = ask(governed)
    assert fresh != stale
    governed.service.approve(fresh, actor="bea")
    clock.advance(DAY_MS // 1000)
    assert ask(governed) not in (stale, fresh)
    assert manual_runs(governed) == 0


def test_a_rejection_needs_a_reason_and_not_the_requester(governed: Engine) -> None:
    request = ask(governed)
    with pytest.raises(InvalidInput, match="at least 10 characters"):
        governed.service.reject(request, actor="bea", reason="no")
    with pytest.raises(PermissionDenied, match="cannot reject it"):
        governed.service.reject(request, actor="olga", reason="changed my mind, sorry")
    rejected = governed.service.reject(request, actor="bea", reason="payroll runs on Fridays only")
    assert rejected.stored_state is ApprovalState.REJECTED
    with pytest.raises(Conflict, match="is rejected"):
        governed.service.approve(request, actor="bea")
    assert ask(governed) != request  # asking again is a new request


def test_creating_and_resuming_a_sensitive_schedule_wait_for_approval(governed: Engine) -> None:
    spec = ScheduleSpec(
        "bonus", IntervalTrigger(MINUTE_MS, T0), "noop", tenant="acme", sensitive=True
    )
    with pytest.raises(ApprovalRequired) as waiting:
        governed.service.create(spec, actor="olga")
    with pytest.raises(NotFound):
        governed.service.get("bonus", tenant="acme", actor="vera")
    governed.service.approve(waiting.value.approval.id, actor="bea")
    governed.service.create(spec, actor="olga")
    governed.service.pause("bonus", actor="olga", tenant="acme")
    with pytest.raises(ApprovalRequired):
        governed.service.resume("bonus", actor="olga", tenant="acme")


def test_unknown_request_ids_are_not_found(governed: Engine) -> None:
    with pytest.raises(NotFound, match="no approval request 'nope'"):
        governed.service.approve("nope", actor="bea")
    request = ask(governed)
    with pytest.raises(NotFound):
        governed.service.approve(request, actor="bea", tenant="globex")


def test_the_cli_asks_for_approval_with_exit_6_and_refuses_bad_input(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=ManualClock(T0)) as trusted:
        trusted.service.create(
            ScheduleSpec("payroll", IntervalTrigger(MINUTE_MS, T0), "noop", sensitive=True),
            actor="setup",
        )
    waiting = run_cli("schedule", "trigger", "payroll", db=db)
    assert waiting.code == 6, waiting
    assert "vortos approvals approve" in waiting.stderr
    listed = run_cli("approvals", "list", "--json", db=db)
    assert listed.code == 0
    assert '"state": "pending"' in listed.stdout
    request = listed.stdout.split('"id": "', 1)[1].split('"', 1)[0]
    self_approval = run_cli("approvals", "approve", request, db=db)
    assert self_approval.code == 4
    assert "cannot approve it" in self_approval.stderr
    assert run_cli("approvals", "approve", "nope", db=db).code == 3
    short = run_cli("approvals", "reject", request, "--reason", "no", db=db)
    assert short.code == 2
    assert "at least 10 characters" in short.stderr
    assert run_cli("approvals", "list", "--state", "sleeping", db=db).code == 2
