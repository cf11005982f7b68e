"""Four-eyes across a real trust boundary (acceptance 2): `vortos run --control-socket` as the
service account (root, here) owns the database and the audit key; two throwaway Unix accounts,
created for the test, are operators in the socket's group. Each is who the kernel says, and no
environment variable makes one the other.

Needs root (to create the accounts with useradd); skipped with a reason otherwise.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine import Engine, IntervalTrigger, RunKind, ScheduleSpec, open_engine
from engine.domain.access import Grant, Role
from engine.domain.approvals import ApprovalState
from engine.domain.audit import tenant_chain
from engine.domain.timeutil import HOUR_MS
from engine.ports.runs import RunQuery
from tests.security.deployment import Deployment, accounts, deployment, needs_root

# Long enough for the four CLI processes between a request and its approval on a loaded machine
# (each starts Python and drops privileges; 3 s expired a request before bob approved it).
APPROVAL_TTL_S = 15

pytestmark = needs_root


@dataclass(frozen=True)
class Site:
    """The deployment: the group, the two operators, the files, the running server."""

    group: str
    alice: str
    bob: str
    db: Path
    sock: Path
    served: Deployment
    outsider: str


def _seed(alice: str, bob: str) -> Callable[[Engine], None]:
    def seed(trusted: Engine) -> None:  # set up by the service account
        now = trusted.clock.now_ms()
        for name, sensitive in (("payroll", True), ("report", False)):
            trusted.service.create(
                ScheduleSpec(
                    name,
                    IntervalTrigger(HOUR_MS, now + HOUR_MS),
                    "noop",
                    tenant="acme",
                    sensitive=sensitive,
                ),
                actor="root",
            )
        for who, role, tenant in (
            ("root", Role.ADMIN, "*"),
            (alice, Role.OPERATOR, "acme"),
            (bob, Role.APPROVER, "acme"),
        ):
            trusted.storage.operators.grant(Grant(who, role, tenant), by="root", at=now)

    return seed


@pytest.fixture
def site() -> Iterator[Site]:
    """The README's layout (tests/security/deployment.py): the database and key the service
    account's, the operators in the socket's group, `vortos run --control-socket` serving."""
    with (
        accounts() as made,
        deployment(
            made,
            _seed(made.alice, made.bob),
            run_args=("--approval-ttl", f"{APPROVAL_TTL_S}s", "--no-consume"),
        ) as served,
    ):
        assert oct(Path(f"{served.db}.audit-key").stat().st_mode & 0o777) == "0o600"
        yield Site(made.group, made.alice, made.bob, served.db, served.sock, served, made.outsider)


def as_account(
    site: Site, user: str, *args: str, env: dict[str, str] | None = None, socket_on: bool = True
) -> subprocess.CompletedProcess[str]:
    return site.served.as_account(user, *args, env=env, socket_on=socket_on)


def request_id(stderr: str) -> str:
    found = re.search(r"request (\w+) is pending", stderr)
    assert found, stderr
    return found.group(1)


def manual_runs(site: Site) -> int:
    with open_engine(site.db, create=False, readonly=True) as engine:
        runs = engine.storage.runs.query(RunQuery(tenant="acme", limit=1000))
        return sum(1 for r in runs if r.kind is RunKind.MANUAL and r.schedule_name == "payroll")


def approval_state(site: Site, approval_id: str) -> ApprovalState:
    with open_engine(site.db, create=False, readonly=True) as engine:
        found = engine.storage.approvals.get(approval_id)
        assert found is not None
        return found.state_at(engine.clock.now_ms())


def wait_until_expired(site: Site, approval_id: str) -> None:
    deadline = time.monotonic() + APPROVAL_TTL_S + 10
    while approval_state(site, approval_id) is not ApprovalState.EXPIRED:
        assert time.monotonic() < deadline, f"{approval_id} never expired"
        time.sleep(0.1)


def test_four_eyes_between_two_real_accounts_over_the_control_socket(site: Site) -> None:
    trigger = ("schedule", "trigger", "payroll", "--tenant", "acme")

    # The socket is the group's, mode 0660; the accounts are who the server says they are.
    assert oct(site.sock.stat().st_mode & 0o777) == "0o660"

    # alice asks: the change waits for a second operator.
    asked = as_account(site, site.alice, *trigger)
    assert asked.returncode == 6, asked.stderr
    first = request_id(asked.stderr)
    assert manual_runs(site) == 0

    # alice cannot approve her own request, not even claiming to be bob.
    for env in ({}, {"USER": site.bob, "LOGNAME": site.bob}):
        own = as_account(site, site.alice, "approvals", "approve", first, env=env)
        assert own.returncode == 4, own.stderr
        assert f"{site.alice} asked for {first} and so cannot approve it" in own.stderr
    assert approval_state(site, first) is ApprovalState.PENDING

    # bob approves; alice's change then happens, exactly once.
    approved = as_account(site, site.bob, "approvals", "approve", first)
    assert approved.returncode == 0, approved.stderr
    done = as_account(site, site.alice, *trigger)
    assert done.returncode == 0, done.stderr
    assert manual_runs(site) == 1
    assert approval_state(site, first) is ApprovalState.CONSUMED

    # The approval is used up: the same change asks again.
    again = as_account(site, site.alice, *trigger)
    assert again.returncode == 6, again.stderr
    assert request_id(again.stderr) != first
    assert manual_runs(site) == 1

    # An approval that expired before its use is refused: the change asks again.
    late = request_id(again.stderr)
    assert as_account(site, site.bob, "approvals", "approve", late).returncode == 0
    wait_until_expired(site, late)
    expired = as_account(site, site.alice, *trigger)
    assert expired.returncode == 6, expired.stderr
    assert manual_runs(site) == 1

    # A request that expired unapproved cannot be approved any more.
    stale = request_id(expired.stderr)
    wait_until_expired(site, stale)
    refused = as_account(site, site.bob, "approvals", "approve", stale)
    assert refused.returncode == 5, refused.stderr
    assert "expired" in refused.stderr

    # The audit chain names each account as the kernel reported it.
    with open_engine(site.db, create=False, readonly=True) as engine:
        entries = engine.storage.audit.entries(tenant_chain("acme"))
    actors = {(e.event, e.actor) for e in entries}
    assert {
        ("approval.requested", site.alice),
        ("approval.approved", site.bob),
        ("approval.consumed", site.alice),
        ("fire.manual", site.alice),
    } <= actors
    assert not any(e.actor == site.bob for e in entries if e.event != "approval.approved")


def report_state(site: Site) -> tuple[str, int]:
    with open_engine(site.db, create=False, readonly=True) as engine:
        found = engine.storage.schedules.find_by_name("acme", "report")
        assert found is not None
        return found.status.value, found.version


def test_without_the_socket_an_operator_cannot_write_the_database(site: Site) -> None:
    before = report_state(site)
    direct = as_account(
        site, site.alice, "schedule", "pause", "report", "--tenant", "acme", socket_on=False
    )
    assert direct.returncode != 0
    assert "Traceback" not in direct.stderr
    assert "read-only" in direct.stderr or "readonly" in direct.stderr, direct.stderr
    assert report_state(site) == before
    through = as_account(site, site.alice, "schedule", "pause", "report", "--tenant", "acme")
    assert through.returncode == 0, through.stderr
    listed = as_account(site, site.alice, "schedule", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {s["name"]: s["status"] for s in json.loads(listed.stdout)}["report"] == "paused"


def test_an_account_outside_the_group_cannot_connect(site: Site) -> None:
    result = as_account(site, site.outsider, "approvals", "list")
    # It cannot even read the database directory, let alone reach the socket.
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
