"""Attack U4: an account holding no role is not shown an empty world.

With operators defined, an account without any grant that lists schedules, runs, dead letters,
approvals or the audit tail is told the truth (exit 4): it holds no role that lets it view any
tenant, so nothing can be shown to it, and which grant to ask for. "No schedules yet" would
tell it there is nothing here. The same through the control socket and on the group-readable
file itself. A viewer of an empty tenant still gets its honest empty list, and a database with
no operator at all still lets its first account in.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine import Engine, IntervalTrigger, ScheduleSpec
from engine.domain.access import Grant, Role
from engine.domain.timeutil import MINUTE_MS
from tests.conftest import T0, run_cli
from tests.security.deployment import Accounts, Deployment, deployment

LISTS = {
    "schedule list": ("no schedules yet",),
    "runs list": ("no runs match",),
    "queue list": ("no dead letters",),
    "approvals list": ("no approval requests",),
    "audit tail": ("no audit entries",),
}
QUIET = "quiet"  # a tenant that holds nothing


def _seed(made: Accounts) -> Callable[[Engine], None]:
    def seed(engine: Engine) -> None:
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop", tenant="a"),
            actor=made.alice,
        )
        engine.service.trigger("report", tenant="a", actor=made.alice)
        now = engine.clock.now_ms()
        engine.storage.operators.grant(Grant(made.alice, Role.ADMIN), by="root", at=now)
        engine.storage.operators.grant(Grant(made.bob, Role.VIEWER, QUIET), by="root", at=now)

    return seed


@pytest.fixture
def site(ops: Accounts) -> Iterator[Deployment]:
    with deployment(ops, _seed(ops)) as served:
        yield served


def _refused_with_the_truth(
    done: subprocess.CompletedProcess[str], who: str, empty_claims: tuple[str, ...]
) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == 4, out
    assert f"{who} holds no role that lets it view any tenant here" in done.stderr
    assert f"`vortos operators grant {who} viewer --tenant T`" in done.stderr
    for claim in empty_claims:
        assert claim not in out
    assert "Traceback" not in out


@pytest.mark.parametrize("socket_on", [True, False], ids=["socket", "file"])
def test_an_account_with_no_role_is_told_so_by_every_list_read_not_shown_an_empty_one(
    site: Deployment, ops: Accounts, socket_on: bool
) -> None:
    for command, empty_claims in LISTS.items():
        done = site.as_account(ops.carol, *command.split(), socket_on=socket_on)
        _refused_with_the_truth(done, ops.carol, empty_claims)
    as_json = site.as_account(ops.carol, "schedule", "list", "--json", socket_on=socket_on)
    _refused_with_the_truth(as_json, ops.carol, ())
    assert as_json.stdout == ""  # no `[]` for a script to read as "there are none"


@pytest.mark.parametrize("socket_on", [True, False], ids=["socket", "file"])
def test_a_viewer_of_an_empty_tenant_gets_an_honest_empty_list(
    site: Deployment, ops: Accounts, socket_on: bool
) -> None:
    for command, (empty,) in LISTS.items():
        if command == "audit tail":
            continue  # the tenant has no chain; its viewer sees no other
        done = site.as_account(ops.bob, *command.split(), socket_on=socket_on)
        assert done.returncode == 0, done.stdout + done.stderr
        assert empty in done.stdout + done.stderr
    listed = site.as_account(ops.bob, "schedule", "list", "--json", socket_on=socket_on)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    # And the admin, for contrast, sees tenant a's schedule.
    admin = site.as_account(ops.alice, "schedule", "list", "--json", socket_on=socket_on)
    assert "a" in {s["tenant"] for s in json.loads(admin.stdout)}, admin.stderr


def test_a_database_with_no_operator_lists_for_its_first_account_as_before(
    tmp_path: Path,
) -> None:
    """No operator at all: every account may read (and its first change makes it admin)."""
    db = tmp_path / "vortos.db"
    assert run_cli("db", "init", db=db).code == 0
    for command, (empty,) in LISTS.items():
        done = run_cli(*command.split(), db=db)
        assert done.code == 0, done.stderr
        assert empty in done.stdout + done.stderr, command
