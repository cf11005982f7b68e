"""Socket-only layout (issue 15, acceptance 2: reading another tenant through every read command
and the console): with `operator_file_access = "none"` the service's files are its own (0600)
and every operator read goes through the control socket, where the server narrows it to the
tenants of the account the kernel reports. Alice operates acme only; globex is another tenant
with the same kinds of rows (schedules, runs, a dead letter, an approval request, retention,
audit entries). Each test names the promise it attacks.

Needs root (real Unix accounts); skipped with a reason otherwise.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from engine import Engine, IntervalTrigger, ScheduleSpec
from engine.domain.access import Grant, Role
from engine.domain.run import RunState
from engine.domain.timeutil import HOUR_MS
from engine.ports.fire_queue import Outcome, Settlement
from tests.security.deployment import (
    ROOT,
    Accounts,
    Deployment,
    accounts,
    deployment,
    needs_root,
    request_id,
)

pytestmark = needs_root

TENANTS = ("acme", "globex")


@dataclass
class Site:
    ops: Accounts
    site: Deployment
    runs: dict[str, int]  # a run id per tenant
    approvals: dict[str, str]  # a pending approval request per tenant
    schedule_ids: dict[str, str]


def _seed(made: Accounts, runs: dict[str, int], ids: dict[str, str]) -> Callable[[Engine], None]:
    def seed(engine: Engine) -> None:
        service, storage = engine.service, engine.storage
        now = engine.clock.now_ms()
        for tenant in TENANTS:
            for name in ("report", f"only-{tenant}", "payroll", "doomed"):
                made_one = service.create(
                    ScheduleSpec(
                        name,
                        IntervalTrigger(HOUR_MS, now),
                        "noop",
                        tenant=tenant,
                        sensitive=name == "payroll",
                        payload={"owner": f"{tenant}-team"},
                    ),
                    actor="root",
                )
                if name == "report":
                    ids[tenant] = made_one.id
            service.set_retention(tenant, 30, actor="root", reason=f"{tenant} contract")
        # A dead letter per tenant: its fire claimed and discarded, as a failing consumer does.
        doomed = [service.trigger("doomed", actor="root", tenant=t) for t in TENANTS]
        claim = storage.fire_queue.claim(consumer="seed", ttl_ms=60_000, limit=10)
        storage.fire_queue.settle(
            claim.token,
            "seed",
            [
                Settlement(r.id, Outcome.DISCARD, RunState.DEAD_LETTERED, error="boom")
                for r in doomed
            ],
        )
        for tenant in TENANTS:
            runs[tenant] = service.trigger("report", actor="root", tenant=tenant).id
        grants = [
            Grant("root", Role.ADMIN),
            Grant(made.carol, Role.ADMIN),
            Grant(made.alice, Role.OPERATOR, "acme"),
            Grant(made.bob, Role.OPERATOR, "globex"),
        ]
        for grant in grants:
            storage.operators.grant(grant, by="root", at=now)

    return seed


@pytest.fixture(scope="module")
def served() -> Iterator[Site]:
    if os.geteuid() != 0:
        pytest.skip("creates Unix accounts with useradd: run the tests as root (CI does)")
    runs: dict[str, int] = {}
    ids: dict[str, str] = {}
    with (
        accounts() as made,
        deployment(
            made,
            _seed(made, runs, ids),
            env={"VORTOS_OPERATOR_FILE_ACCESS": "none"},
        ) as site,
    ):
        approvals = {}
        for tenant, who in (("acme", made.alice), ("globex", made.bob)):
            asked = site.as_account(
                who, "schedule", "edit", "payroll", "--tenant", tenant, "--not-sensitive"
            )
            assert asked.returncode == 6, asked.stderr
            approvals[tenant] = request_id(asked.stderr)
        yield Site(made, site, runs, approvals, ids)


def alice(s: Site, *args: str, socket_on: bool = True) -> subprocess.CompletedProcess[str]:
    return s.site.as_account(s.ops.alice, *args, socket_on=socket_on)


def _clean(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr + result.stdout


# -- the files ----------------------------------------------------------------------------------


def test_socket_only_layout_leaves_operators_no_file_access(served: Site) -> None:
    """Promise: in the socket-only layout no file of the database is readable by an operator,
    and a read that bypasses the socket fails with a clear message, not a traceback."""
    files = [p for p in served.site.base.iterdir() if p.name.startswith("vortos.db")]
    assert files, "the database is missing"
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    direct = alice(served, "schedule", "list", "--json", socket_on=False)
    assert direct.returncode == 1, direct.stderr
    assert str(served.site.db) in direct.stderr
    _clean(direct)
    # Through the socket the same account reads what it may.
    through = alice(served, "schedule", "list", "--json")
    assert through.returncode == 0, through.stderr


# -- every read command: acme's rows, never globex's --------------------------------------------


READS = {
    "schedule list": ("schedule", "list", "--json"),
    "runs list": ("runs", "list", "--json"),
    "queue list": ("queue", "list", "--json"),
    "approvals list": ("approvals", "list", "--json"),
    "audit tail": ("audit", "tail", "--json", "-n", "500"),
    "audit export": ("audit", "export"),
    "audit verify": ("audit", "verify", "--json"),
    "retention show": ("retention", "show", "--json"),
    "db info": ("db", "info", "--json"),
    "schedule show": ("schedule", "show", "report", "--tenant", "acme", "--json"),
    "schedule preview": ("schedule", "preview", "report", "--tenant", "acme", "--json"),
}


@pytest.mark.parametrize("command", list(READS))
def test_every_read_command_shows_alice_acme_and_never_globex(served: Site, command: str) -> None:
    """Promise: each read command, through the socket, answers with the reader's tenants'
    rows only (the server narrows it): alice sees acme's and nothing of globex, not even its
    name."""
    result = alice(served, *READS[command])
    assert result.returncode == 0, result.stderr
    _clean(result)
    assert "globex" not in result.stdout + result.stderr
    if command not in ("db info", "schedule preview"):
        assert "acme" in result.stdout, result.stdout


def test_list_reads_hold_every_acme_row_kind(served: Site) -> None:
    """Promise: narrowing removes the other tenant's rows, not the reader's own: alice's lists
    hold acme's schedules, runs, dead letter, approval, retention and audit entries."""
    schedules = json.loads(alice(served, "schedule", "list", "--json").stdout)
    assert {s["name"] for s in schedules} >= {"report", "only-acme", "payroll", "doomed"}
    runs = json.loads(alice(served, "runs", "list", "--json").stdout)
    assert served.runs["acme"] in {r["id"] for r in runs}
    dead = json.loads(alice(served, "queue", "list", "--json").stdout)
    assert [d["tenant"] for d in dead] == ["acme"]
    asked = json.loads(alice(served, "approvals", "list", "--json").stdout)
    assert [a["id"] for a in asked] == [served.approvals["acme"]]
    kept = json.loads(alice(served, "retention", "show", "--json").stdout)
    assert [o["tenant"] for o in kept["overrides"]] == ["acme"]
    export = alice(served, "audit", "export").stdout.splitlines()
    assert export
    assert {json.loads(line)["chain"] for line in export} == {"tenant:acme"}
    info = json.loads(alice(served, "db", "info", "--json").stdout)
    assert "schedules" not in info  # counts of every tenant: for a viewer of every tenant
    assert info["schema_version"]


def test_an_admin_of_every_tenant_reads_both_through_the_socket(served: Site) -> None:
    """Promise: the narrowing is by role, not a blanket refusal: carol (admin everywhere) sees
    both tenants through the same socket, and every grant, and the whole-site counts."""
    carol = served.ops.carol
    schedules = json.loads(served.site.as_account(carol, "schedule", "list", "--json").stdout)
    assert {s["tenant"] for s in schedules} >= set(TENANTS)
    grants = json.loads(served.site.as_account(carol, "operators", "list", "--json").stdout)
    assert {g["operator"] for g in grants} >= {served.ops.alice, served.ops.bob}
    info = json.loads(served.site.as_account(carol, "db", "info", "--json").stdout)
    assert info["schedules"] >= 8


NAMING_GLOBEX = {
    "schedule list": ("schedule", "list", "--tenant", "globex"),
    "schedule show": ("schedule", "show", "report", "--tenant", "globex"),
    "schedule preview": ("schedule", "preview", "report", "--tenant", "globex"),
    "runs list": ("runs", "list", "--tenant", "globex"),
    "runs list --schedule": ("runs", "list", "--schedule", "report", "--tenant", "globex"),
    "queue list": ("queue", "list", "--tenant", "globex"),
    "approvals list": ("approvals", "list", "--tenant", "globex"),
    "audit tail": ("audit", "tail", "--chain", "tenant:globex"),
    "audit export": ("audit", "export", "--chain", "tenant:globex"),
    "audit verify": ("audit", "verify", "--chain", "tenant:globex"),
}


@pytest.mark.parametrize("command", list(NAMING_GLOBEX))
def test_naming_another_tenant_is_refused(served: Site, command: str) -> None:
    """Promise: a read that names a tenant the reader may not view is refused (exit 4) before
    anything of it is looked up."""
    result = alice(served, *NAMING_GLOBEX[command])
    assert result.returncode == 4, (result.returncode, result.stdout, result.stderr)
    assert "may not" in result.stderr
    assert "only-globex" not in result.stdout + result.stderr
    _clean(result)


def test_another_tenants_run_and_approval_ids_are_not_found(served: Site) -> None:
    """Promise: another tenant's run or approval id is not found (exit 3), exactly as an id
    that does not exist: the id tells alice nothing."""
    run = alice(served, "runs", "show", str(served.runs["globex"]))
    assert run.returncode == 3, run.stderr
    missing = alice(served, "runs", "show", "999999")
    assert missing.returncode == 3
    assert run.stderr.replace(str(served.runs["globex"]), "N") == missing.stderr.replace(
        "999999", "N"
    )
    approval = alice(served, "approvals", "show", served.approvals["globex"])
    assert approval.returncode == 3, approval.stderr
    assert "globex" not in run.stderr + approval.stderr
    own = alice(served, "runs", "show", str(served.runs["acme"]), "--json")
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout)["tenant"] == "acme"
    mine = alice(served, "approvals", "show", served.approvals["acme"])
    assert mine.returncode == 0, mine.stderr


def test_site_wide_reads_need_the_viewer_role_in_every_tenant(served: Site) -> None:
    """Promise: reads whose answer covers every tenant (the doctor's findings, the operators'
    grants) are refused to an operator of one tenant (exit 4) and served to an admin."""
    doctor = alice(served, "doctor", "--json")
    assert doctor.returncode == 4, doctor.stderr
    assert "viewer role in every tenant" in doctor.stderr
    grants = alice(served, "operators", "list")
    assert grants.returncode == 4, grants.stderr
    _clean(doctor)
    by_admin = served.site.as_account(served.ops.carol, "doctor", "--json")
    assert by_admin.returncode in (0, 1), by_admin.stderr  # findings, pass or fail
    findings = json.loads(by_admin.stdout)["findings"]
    assert any(f["check_id"] == "audit.chain" for f in findings)


def _console_reads(served: Site, user: str, probe: dict[str, object]) -> dict[str, Any]:
    """What the console's read model over the socket returns to `user` (see
    tests/security/socket_console_reads.py)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.security.socket_console_reads",
            user,
            str(served.site.sock),
            json.dumps(probe),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


# -- the console --------------------------------------------------------------------------------


def test_the_console_over_the_socket_reads_acme_only(served: Site) -> None:
    """Promise: the console's read model over the socket (every call: overview, schedules,
    fires, schedule, run, audit, approvals) shows alice acme's rows only; globex's schedule
    and run, asked by id, are as absent."""
    seen = _console_reads(
        served,
        served.ops.alice,
        {"schedule_id": served.schedule_ids["globex"], "run_id": served.runs["globex"]},
    )
    assert seen["scope"] == ["acme"]
    assert seen["schedules"] == ["acme"]
    assert "only-acme" in seen["schedule_names"]
    assert seen["fires"] == ["acme"]
    assert seen["chains"] == ["tenant:acme"]
    assert seen["recent"] == ["tenant:acme"]
    assert seen["approvals"] == ["acme"]
    assert seen["counts"] == [4, 1]  # acme's schedules and dead letter only
    assert seen["foreign_schedule"] is False
    assert seen["foreign_run"] is False
    assert seen["own_schedule"] is True


# -- who may connect, and when nothing serves ---------------------------------------------------


def test_the_outsider_cannot_connect(served: Site) -> None:
    """Promise: an account outside the control group reaches neither the socket nor the file,
    and is told so."""
    through = served.site.as_account(served.ops.outsider, "schedule", "list")
    assert through.returncode == 1
    assert "may not connect" in through.stderr, through.stderr
    direct = served.site.as_account(served.ops.outsider, "schedule", "list", socket_on=False)
    assert direct.returncode == 1
    _clean(through)
    _clean(direct)


def test_a_malformed_read_request_is_refused_clearly(served: Site) -> None:
    """Promise: every read argument is validated by the server (type and bounds), with a
    message that says what is wrong: a client that skips the CLI gets no more."""
    for args, said in (
        ({"limit": 10**9}, "'limit' is 1000000000"),
        ({"limit": "all"}, "'limit' must be an integer"),
        ({"tenant": "x" * 5000}, "longer than"),
        ({"status": "gone"}, "'status' is 'gone'"),
    ):
        request = json.dumps({"v": 1, "op": "schedules", "args": args})
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.security.raw_request",
                served.ops.alice,
                str(served.site.sock),
            ],
            input=request,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
        )
        answer = json.loads(result.stdout)
        assert answer["ok"] is False, answer
        assert answer["error"]["exit_code"] == 2
        assert said in answer["error"]["message"], answer


def test_whoami_is_the_kernels_account_and_its_tenants(served: Site) -> None:
    """Promise: the server names the caller by SO_PEERCRED and says which tenants it reads."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.security.raw_request",
            served.ops.alice,
            str(served.site.sock),
        ],
        input=json.dumps({"v": 1, "op": "whoami", "args": {"operator": "root"}}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    answer = json.loads(result.stdout)["result"]
    assert answer["operator"] == served.ops.alice
    assert answer["tenants"] == ["acme"]


def test_a_read_while_the_service_is_stopped_says_so(served: Site) -> None:
    """Promise: with the service stopped, an operator's read (CLI and console) says plainly
    that nothing serves the socket and what to do, exit 1, no traceback. (Runs last: it stops
    the module's service.)"""
    served.site.stop()
    listed = alice(served, "schedule", "list")
    assert listed.returncode == 1
    assert "the scheduler service is not running" in listed.stderr, listed.stderr
    assert "VORTOS_CONTROL_SOCKET" in listed.stderr
    _clean(listed)
    # The console: its read model says the same (shown as the degraded banner), and the
    # console refuses to start with it (run here as the service's own account: the accounts
    # made for the test cannot load Textual from this interpreter's tree).
    banner = _console_reads(served, served.ops.alice, {"schedule_id": "x", "run_id": 1})
    assert "the scheduler service is not running" in banner["error"]
    console = subprocess.run(
        [sys.executable, "-m", "vortos_tui.cli", "tui", "--attach"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=ROOT,
        env={**os.environ, "VORTOS_CONTROL_SOCKET": str(served.site.sock)},
    )
    assert console.returncode == 1, console.stderr
    assert "the scheduler service is not running" in console.stderr
    _clean(console)
