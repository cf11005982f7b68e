"""Acceptance: for each operation and each role, allowed or refused as the README's table
says; a grant in one tenant counts only there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.domain.access import ANY_TENANT, Grant, Identity, Operation, Role
from engine.governance.policy import RoleBasedPolicy

README = Path(__file__).resolve().parents[2] / "README.md"


def documented_matrix() -> dict[tuple[Operation, Role], bool]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Operators and roles", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"^\| [a-z-]+ \| (yes|no) ", line)]
    matrix: dict[tuple[Operation, Role], bool] = {}
    for line in rows:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        operation = Operation(cells[0])
        for role, cell in zip(Role, cells[1:], strict=True):
            matrix[(operation, role)] = cell == "yes"
    return matrix


MATRIX = documented_matrix()


def test_the_readme_table_covers_every_operation_and_role() -> None:
    assert set(MATRIX) == {(o, r) for o in Operation for r in Role}


@pytest.mark.parametrize(("operation", "role"), sorted(MATRIX, key=str), ids=str)
def test_a_role_in_every_tenant_is_allowed_exactly_as_documented(
    operation: Operation, role: Role
) -> None:
    identity = Identity("alice", (Grant("alice", role, ANY_TENANT),))
    decision = RoleBasedPolicy().decide(identity, operation, "acme")
    assert decision.allowed is MATRIX[(operation, role)], decision.reason


@pytest.mark.parametrize(("operation", "role"), sorted(MATRIX, key=str), ids=str)
def test_a_role_in_one_tenant_counts_there_and_nowhere_else(
    operation: Operation, role: Role
) -> None:
    identity = Identity("alice", (Grant("alice", role, "acme"),))
    policy = RoleBasedPolicy()
    there = policy.decide(identity, operation, "acme")
    elsewhere = policy.decide(identity, operation, "globex")
    everywhere_needed = operation is Operation.MANAGE_OPERATORS
    assert there.allowed is (MATRIX[(operation, role)] and not everywhere_needed)
    assert not elsewhere.allowed
    assert "globex" in elsewhere.reason or "every tenant" in elsewhere.reason


def test_a_refusal_names_the_missing_role_and_how_to_get_it() -> None:
    identity = Identity("alice", (Grant("alice", Role.VIEWER, "acme"),))
    decision = RoleBasedPolicy().decide(identity, Operation.PAUSE, "acme")
    assert not decision.allowed
    assert decision.reason == (
        "alice may not pause in tenant acme: that needs the operator role there (has: viewer); "
        "an admin can grant it with `vortos operators grant alice operator --tenant acme`"
    )


def test_no_grant_at_all_is_refused_everything() -> None:
    nobody = Identity("mallory")
    for operation in Operation:
        assert not RoleBasedPolicy().decide(nobody, operation, "acme").allowed
