"""Operators, roles and the first admin, through the service with access control on (as the
CLI and the console run it), and through the CLI."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import (
    Conflict,
    Engine,
    IntervalTrigger,
    InvalidInput,
    ManualClock,
    NotFound,
    ScheduleSpec,
    open_engine,
)
from engine.domain.access import ANY_TENANT, Grant, PermissionDenied, Role
from engine.domain.audit import SYSTEM_CHAIN
from engine.domain.timeutil import MINUTE_MS
from tests.cli.support import db_state
from tests.conftest import T0, run_cli


def spec(name: str, tenant: str) -> ScheduleSpec:
    return ScheduleSpec(name, IntervalTrigger(MINUTE_MS, T0), "noop", tenant=tenant)


@pytest.fixture
def governed(tmp_path: Path) -> Iterator[Engine]:
    """admin holds admin everywhere; olga operates acme; vera views acme; no one else."""
    with open_engine(tmp_path / "vortos.db", clock=ManualClock(T0), enforce=True) as engine:
        engine.service.create(spec("report", "acme"), actor="admin")  # the first admin
        engine.service.create(spec("ledger", "globex"), actor="admin")
        engine.service.grant_role("olga", Role.OPERATOR, actor="admin", tenant="acme")
        engine.service.grant_role("vera", Role.VIEWER, actor="admin", tenant="acme")
        yield engine


def test_the_first_account_to_change_a_database_becomes_its_admin(governed: Engine) -> None:
    grants = governed.service.operators(actor="admin")
    assert Grant("admin", Role.ADMIN, ANY_TENANT) in grants
    events = [e.event for e in reversed(governed.storage.audit.latest(SYSTEM_CHAIN, limit=9))]
    assert events == [
        "audit.chain_opened",
        "operator.granted",
        "operator.granted",
        "operator.granted",
    ]
    first = governed.storage.audit.entries(SYSTEM_CHAIN, after_seq=1, limit=1)[0]
    assert first.data["first_admin"] is True
    assert first.data["operator"] == "admin"


def test_an_operator_changes_their_tenant_and_nothing_else(governed: Engine) -> None:
    governed.service.pause("report", actor="olga", tenant="acme")
    governed.service.trigger("report", actor="olga", tenant="acme")
    with pytest.raises(PermissionDenied, match="olga may not pause in tenant globex"):
        governed.service.pause("ledger", actor="olga", tenant="globex")
    with pytest.raises(PermissionDenied, match="needs the admin role"):
        governed.service.grant_role("olga", Role.ADMIN, actor="olga")


def test_a_viewer_is_refused_every_change_with_the_missing_role_named(governed: Engine) -> None:
    before = governed.service.get("report", tenant="acme", actor="vera")
    for change in (
        lambda: governed.service.pause("report", actor="vera", tenant="acme"),
        lambda: governed.service.trigger("report", actor="vera", tenant="acme"),
        lambda: governed.service.delete("report", actor="vera", tenant="acme"),
        lambda: governed.service.create(spec("mine", "acme"), actor="vera"),
    ):
        with pytest.raises(PermissionDenied, match="needs the operator role there"):
            change()
    assert governed.service.get("report", tenant="acme", actor="vera") == before


def test_an_account_with_no_grant_is_refused_once_a_database_has_operators(
    governed: Engine,
) -> None:
    with pytest.raises(PermissionDenied, match=r"mallory may not create .*has: no role"):
        governed.service.create(spec("evil", "acme"), actor="mallory")


def test_grants_and_revokes_are_audited_and_the_last_admin_stays(governed: Engine) -> None:
    governed.service.revoke_role("vera", Role.VIEWER, actor="admin", tenant="acme")
    with pytest.raises(NotFound, match="does not hold viewer"):
        governed.service.revoke_role("vera", Role.VIEWER, actor="admin", tenant="acme")
    with pytest.raises(Conflict, match="last admin"):
        governed.service.revoke_role("admin", Role.ADMIN, actor="admin")
    newest = governed.storage.audit.latest(SYSTEM_CHAIN, limit=1)[0]
    assert (newest.event, newest.data["operator"]) == ("operator.revoked", "vera")


@pytest.mark.parametrize(
    ("operator", "tenant", "message"),
    [
        ("bad name", ANY_TENANT, "is not an account name"),
        ("x" * 65, ANY_TENANT, "is not an account name"),
        ("alice", "Bad Tenant!", "tenant"),
    ],
)
def test_bad_grants_are_refused_and_change_nothing(
    governed: Engine, operator: str, tenant: str, message: str
) -> None:
    before = governed.service.operators(actor="admin")
    with pytest.raises(InvalidInput, match=message):
        governed.service.grant_role(operator, Role.VIEWER, actor="admin", tenant=tenant)
    assert governed.service.operators(actor="admin") == before


def test_a_trusted_engine_checks_nothing(tmp_path: Path) -> None:
    with open_engine(tmp_path / "vortos.db", clock=ManualClock(T0)) as engine:
        engine.service.create(spec("report", "acme"), actor="anyone")
        engine.storage.operators.grant(Grant("someone", Role.ADMIN), by="test", at=T0)
        engine.service.pause("report", actor="not-an-operator", tenant="acme")


# -- through the CLI (as the OS account running the tests) ----------------------------------


def test_the_cli_refuses_an_account_without_a_role_with_exit_4_and_changes_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        engine.service.create(spec("report", "default"), actor="setup")
        engine.storage.operators.grant(Grant("somebody-else", Role.ADMIN), by="test", at=T0)
    before = db_state(db)
    # Claiming to be the admin through the environment changes nothing: the uid decides.
    claimed = {"USER": "somebody-else", "LOGNAME": "somebody-else"}
    result = run_cli("schedule", "pause", "report", db=db, env=claimed)
    assert result.code == 4, result
    assert "may not pause in tenant default" in result.stderr
    assert "vortos operators grant" in result.stderr
    assert db_state(db) == before


def test_operators_cli_grants_lists_and_revokes(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    assert run_cli("db", "init", db=db).code == 0
    granted = run_cli("operators", "grant", "alice", "operator", "--tenant", "acme", db=db)
    assert granted.code == 0, granted.stderr
    assert "alice now holds operator in tenant acme" in granted.stderr
    listed = run_cli("operators", "list", "--json", db=db)
    assert listed.code == 0
    rows = json.loads(listed.stdout)
    assert {"operator": "alice", "role": "operator", "tenant": "acme"} in rows
    assert any(r["role"] == "admin" and r["tenant"] == ANY_TENANT for r in rows)  # the CLI's user
    assert run_cli("operators", "revoke", "alice", "operator", "--tenant", "acme", db=db).code == 0
    bad = run_cli("operators", "grant", "alice", "overlord", db=db)
    assert bad.code == 2
    assert "unknown role 'overlord'" in bad.stderr


def test_the_cli_shows_an_account_scoped_to_one_tenant_only_that_tenant(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    me = pwd.getpwuid(os.getuid()).pw_name
    with open_engine(db, clock=ManualClock(T0)) as engine:
        for tenant in ("acme", "globex"):
            engine.service.create(spec("report", tenant), actor="setup")
            engine.service.trigger("report", actor="setup", tenant=tenant)
        engine.storage.operators.grant(Grant("somebody-else", Role.ADMIN), by="test", at=T0)
        engine.storage.operators.grant(Grant(me, Role.VIEWER, "acme"), by="test", at=T0)
    listed = run_cli("schedule", "list", "--json", db=db)
    assert listed.code == 0, listed.stderr
    assert [s["tenant"] for s in json.loads(listed.stdout)] == ["acme"]
    runs = run_cli("runs", "list", "--json", db=db)
    assert [r["tenant"] for r in json.loads(runs.stdout)] == ["acme"]
    chains = run_cli("audit", "tail", "--json", db=db)
    assert {e["chain"] for e in json.loads(chains.stdout)} == {"tenant:acme"}
    other = run_cli("schedule", "show", "report", "--tenant", "globex", db=db)
    assert other.code == 4
    assert f"{me} may not view in tenant globex" in other.stderr
    assert run_cli("runs", "show", "2", db=db).code == 3  # globex's run: not found
    export = run_cli("audit", "export", "--chain", "tenant:globex", db=db)
    assert export.code == 4
    assert export.stdout == ""
