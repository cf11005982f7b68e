"""Four-eyes against a hostile operator, over the documented control-socket layout with real
Unix accounts: alice and carol are operators in acme, bob its approver. The service's owner
declares the `echo` command sensitive (setting sensitive_commands), so every schedule running
it needs a second operator, whatever its own flag; `payroll` runs it, `flagged` is a `noop`
schedule marked sensitive by its own flag, `report` is neither.

Each test is one attempt to get around the gate (findings 2 and 3 of issue 15); each ends with
the attacker refused (exit code per the README's table) and nothing changed but the stored
request, or with the approved change made exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from engine import Engine, IntervalTrigger, RunKind, ScheduleSpec
from engine.domain.access import Grant, Role
from engine.domain.approvals import ApprovalState
from engine.domain.audit import tenant_chain
from engine.domain.run import RunState
from engine.domain.timeutil import HOUR_MS
from engine.ports.fire_queue import Outcome, Settlement
from engine.ports.runs import RunQuery
from tests.security.deployment import Accounts, Deployment, accounts, deployment, needs_root
from tests.security.deployment import request_id as pending_id

pytestmark = needs_root

ECHO_PAYLOAD = '{"pay": "everyone"}'


@pytest.fixture(scope="module")
def module_ops() -> Iterator[Accounts]:
    with accounts() as made:
        yield made


def _seed(made: Accounts) -> object:
    def seed(trusted: Engine) -> None:
        now = trusted.clock.now_ms()
        for who, role in (
            ("root", Role.ADMIN),
            (made.alice, Role.OPERATOR),
            (made.carol, Role.OPERATOR),
            (made.bob, Role.APPROVER),
        ):
            tenant = "*" if who == "root" else "acme"
            trusted.storage.operators.grant(Grant(who, role, tenant), by="root", at=now)
        # Made by trusted code, as before the owner declared echo sensitive: its own flag
        # is off, and yet it is protected by what it runs.
        for name, command, sensitive in (
            ("payroll", "echo", False),
            ("flagged", "noop", True),
            ("report", "noop", False),
        ):
            trusted.service.create(
                ScheduleSpec(
                    name,
                    IntervalTrigger(HOUR_MS, now + HOUR_MS),
                    command,
                    payload={"pay": "everyone"} if command == "echo" else {},
                    tenant="acme",
                    sensitive=sensitive,
                ),
                actor="root",
            )
        # A dead letter of payroll and one of report (triggered, claimed, discarded).
        for name in ("payroll", "report"):
            run = trusted.service.trigger(name, actor="root", tenant="acme")
            claim = trusted.storage.fire_queue.claim(consumer="seed", ttl_ms=60_000, limit=10)
            trusted.storage.fire_queue.settle(
                claim.token, "seed", [Settlement(run.id, Outcome.DISCARD, RunState.DEAD_LETTERED)]
            )

    return seed


@pytest.fixture
def site(module_ops: Accounts) -> Iterator[Deployment]:
    with deployment(
        module_ops,
        _seed(module_ops),  # type: ignore[arg-type]
        run_args=("--no-consume", "--approval-ttl", "1h"),
        env={"VORTOS_SENSITIVE_COMMANDS": "echo"},
    ) as served:
        yield served


# -- what the tests look at ---------------------------------------------------------------------


def _state(site: Deployment) -> dict[str, tuple[str, int, bool, str]]:
    """Each acme schedule: status, version, flag, command."""
    with site.trusted() as engine:
        return {
            s.name: (s.status.value, s.version, s.sensitive, s.command)
            for s in engine.service.schedules(tenant="acme")
        }


def _manual_runs(site: Deployment, name: str) -> int:
    """Manual runs of `name`, but for the dead letter seeded."""
    with site.trusted() as engine:
        runs = engine.storage.runs.query(RunQuery(tenant="acme", limit=1000))
    seeded = 1 if name in ("payroll", "report") else 0
    return sum(1 for r in runs if r.kind is RunKind.MANUAL and r.schedule_name == name) - seeded


def _dead_letters(site: Deployment) -> dict[str, int]:
    with site.trusted() as engine:
        dead = engine.service.dead_letters(tenant="acme")
    return {f.schedule_name: f.run_id for f in dead}


def _events(site: Deployment) -> list[str]:
    with site.trusted() as engine:
        return [e.event for e in engine.storage.audit.entries(tenant_chain("acme"))]


def _approval(site: Deployment, approval_id: str) -> ApprovalState:
    with site.trusted() as engine:
        found = engine.storage.approvals.get(approval_id)
        assert found is not None
        return found.state_at(engine.clock.now_ms())


MESSAGES: list[str] = []  # the refusals' stderr, newest last


def _refused_pending(site: Deployment, user: str, *args: str) -> str:
    """`args` as `user`: exit 6, a request stored (or the pending one found) and nothing else
    changed; returns the request's id."""
    before, events = _state(site), _events(site)
    result = site.as_account(user, *args)
    assert result.returncode == 6, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    assert _state(site) == before
    assert _events(site) in ([*events, "approval.requested"], events)
    MESSAGES.append(result.stderr)
    return pending_id(result.stderr)


def _approve(site: Deployment, approval_id: str) -> None:
    done = site.as_account(site.accounts.bob, "approvals", "approve", approval_id)
    assert done.returncode == 0, done.stderr


ECHO = ("--command", "echo", "--payload", ECHO_PAYLOAD, "--tenant", "acme")


# -- delete, recreate, copy, edit ---------------------------------------------------------------


def test_deleting_a_sensitive_schedule_needs_a_second_operator(site: Deployment) -> None:
    """Finding 2: `schedule delete payroll` was not gated; delete-and-recreate stepped around
    four-eyes."""
    asked = _refused_pending(
        site, site.accounts.alice, "schedule", "delete", "flagged", "--tenant", "acme"
    )
    assert "flagged" in _state(site)
    _approve(site, asked)
    done = site.as_account(site.accounts.alice, "schedule", "delete", "flagged", "--tenant", "acme")
    assert done.returncode == 0, done.stderr
    assert "flagged" not in _state(site)
    assert _approval(site, asked) is ApprovalState.CONSUMED


def test_deleting_a_schedule_that_runs_a_sensitive_command_needs_approval(site: Deployment) -> None:
    """Four-eyes follows what is protected: payroll's own flag is off, its command is not."""
    _refused_pending(site, site.accounts.alice, "schedule", "delete", "payroll", "--tenant", "acme")


def test_recreating_a_sensitive_command_without_the_flag_waits(site: Deployment) -> None:
    """Finding 2 as written: `schedule add payroll ...` without --sensitive, then trigger."""
    asked = _refused_pending(
        site, site.accounts.alice, "schedule", "add", "payroll2", "--every", "1h", *ECHO
    )
    assert asked in MESSAGES[-1]
    assert (
        "its command 'echo' is declared sensitive by the sensitive_commands setting"
        in (MESSAGES[-1])
    )
    assert "payroll2" not in _state(site)


def test_a_copy_of_a_sensitive_schedule_under_another_name_waits(site: Deployment) -> None:
    """Finding 2: a copy running the same command and payload under a new name."""
    for name in ("payroll-copy", "payroll-2"):
        _refused_pending(
            site, site.accounts.carol, "schedule", "add", name, "--cron", "0 9 * * *", *ECHO
        )
    assert _manual_runs(site, "payroll-copy") == 0


def test_editing_a_plain_schedule_to_run_a_sensitive_command_waits(site: Deployment) -> None:
    """Four-eyes bypass by edit: report (noop, not sensitive) edited to run echo."""
    _refused_pending(
        site,
        site.accounts.alice,
        "schedule",
        "edit",
        "report",
        "--command",
        "echo",
        "--payload",
        ECHO_PAYLOAD,
        "--tenant",
        "acme",
    )
    assert _state(site)["report"][3] == "noop"


def test_a_schedule_running_a_sensitive_command_cannot_be_made_not_sensitive(
    site: Deployment,
) -> None:
    """Clearing the flag cannot unprotect what the command protects: refused outright."""
    made = site.as_account(
        site.accounts.alice,
        "schedule",
        "add",
        "wages",
        "--every",
        "1h",
        "--start",
        "2030-01-01T00:00:00Z",
        *ECHO,
    )
    assert made.returncode == 6, made.stderr
    _approve(site, pending_id(made.stderr))
    again = site.as_account(
        site.accounts.alice,
        "schedule",
        "add",
        "wages",
        "--every",
        "1h",
        "--start",
        "2030-01-01T00:00:00Z",
        *ECHO,
    )
    assert again.returncode == 0, again.stderr
    assert _state(site)["wages"][2] is True  # stored sensitive: every process sees it
    before = _state(site)
    cleared = site.as_account(
        site.accounts.alice, "schedule", "edit", "wages", "--not-sensitive", "--tenant", "acme"
    )
    assert cleared.returncode == 2, cleared.stderr
    assert "cannot be made not sensitive" in cleared.stderr
    assert _state(site) == before


def test_clearing_the_flag_of_a_sensitive_schedule_waits(site: Deployment) -> None:
    _refused_pending(
        site,
        site.accounts.alice,
        "schedule",
        "edit",
        "flagged",
        "--not-sensitive",
        "--tenant",
        "acme",
    )
    assert _state(site)["flagged"][2] is True


# -- trigger, backfill, resume ------------------------------------------------------------------


def test_triggering_a_schedule_whose_command_is_sensitive_waits(site: Deployment) -> None:
    """payroll's own flag is off (made before the command was declared sensitive)."""
    _refused_pending(
        site, site.accounts.alice, "schedule", "trigger", "payroll", "--tenant", "acme"
    )
    assert _manual_runs(site, "payroll") == 0


def test_backfilling_a_sensitive_command_waits(site: Deployment) -> None:
    _refused_pending(
        site,
        site.accounts.alice,
        "schedule",
        "backfill",
        "payroll",
        "--from",
        "2026-01-01T00:00:00Z",
        "--to",
        "2026-01-01T03:00:00Z",
        "--tenant",
        "acme",
    )


def test_resuming_a_paused_sensitive_schedule_waits(site: Deployment) -> None:
    paused = site.as_account(
        site.accounts.alice, "schedule", "pause", "payroll", "--tenant", "acme"
    )
    assert paused.returncode == 0, paused.stderr  # stopping is never gated
    _refused_pending(site, site.accounts.alice, "schedule", "resume", "payroll", "--tenant", "acme")
    assert _state(site)["payroll"][0] == "paused"


# -- approvals: who may use one, and for what ---------------------------------------------------


def test_an_approval_is_its_requesters_to_use_not_another_operators(site: Deployment) -> None:
    """Approval transplant between operators: carol cannot spend alice's approval."""
    trigger = ("schedule", "trigger", "payroll", "--tenant", "acme")
    asked = _refused_pending(site, site.accounts.alice, *trigger)
    _approve(site, asked)
    other = _refused_pending(site, site.accounts.carol, *trigger)
    assert other != asked
    assert _approval(site, asked) is ApprovalState.APPROVED
    assert _manual_runs(site, "payroll") == 0
    done = site.as_account(site.accounts.alice, *trigger)
    assert done.returncode == 0, done.stderr
    assert _manual_runs(site, "payroll") == 1
    # Reuse: the approval was consumed; the same change asks again.
    again = _refused_pending(site, site.accounts.alice, *trigger)
    assert again != asked
    assert _manual_runs(site, "payroll") == 1


def test_an_approval_for_one_operation_does_not_fit_another(site: Deployment) -> None:
    """An approved trigger is no approved backfill, and no approved delete."""
    asked = _refused_pending(
        site, site.accounts.alice, "schedule", "trigger", "payroll", "--tenant", "acme"
    )
    _approve(site, asked)
    _refused_pending(site, site.accounts.alice, "schedule", "delete", "payroll", "--tenant", "acme")
    assert "payroll" in _state(site)
    assert _approval(site, asked) is ApprovalState.APPROVED


def test_an_approval_is_bound_to_the_schedules_version(site: Deployment) -> None:
    """Approve, then change the schedule (a pause bumps its version): the approval no longer
    fits, so what is applied is always what the approver saw."""
    trigger = ("schedule", "trigger", "payroll", "--tenant", "acme")
    asked = _refused_pending(site, site.accounts.alice, *trigger)
    _approve(site, asked)
    note = site.as_account(
        site.accounts.carol,
        "schedule",
        "pause",
        "payroll",
        "--note",
        "changed meanwhile",
        "--tenant",
        "acme",
    )
    assert note.returncode == 0, note.stderr
    _refused_pending(site, site.accounts.alice, *trigger)
    assert _manual_runs(site, "payroll") == 0


def test_the_requester_cannot_approve_their_own_request_even_as_an_approver(
    site: Deployment,
) -> None:
    """Self-approval: bob, an approver, asks; bob cannot approve it, under any name."""
    asked = _refused_pending(
        site, site.accounts.bob, "schedule", "trigger", "payroll", "--tenant", "acme"
    )
    for env in ({}, {"USER": site.accounts.alice, "LOGNAME": site.accounts.alice}):
        own = site.as_account(site.accounts.bob, "approvals", "approve", asked, env=env)
        assert own.returncode == 4, own.stderr
    assert _approval(site, asked) is ApprovalState.PENDING


# -- finding 3: an open --every anchor ----------------------------------------------------------


def test_a_sensitive_every_create_without_start_completes_once_after_approval(
    site: Deployment,
) -> None:
    """Finding 3: the digest covered an anchor of "now", so each retry was a new request.
    The request is bound to the change as written; its anchor is fixed in the request."""
    add = ("schedule", "add", "hourly-pay", "--every", "1h", *ECHO)
    asked = _refused_pending(site, site.accounts.alice, *add)
    retried = _refused_pending(site, site.accounts.alice, *add)
    assert retried == asked  # asking again while pending is the same request
    shown = site.as_account(site.accounts.alice, "approvals", "show", asked)
    assert shown.returncode == 0, shown.stderr
    anchor = json.loads(shown.stdout)["change"]["definition"]["trigger"]["anchor_ms"]
    _approve(site, asked)
    done = site.as_account(site.accounts.alice, *add)
    assert done.returncode == 0, done.stderr
    assert _approval(site, asked) is ApprovalState.CONSUMED
    with site.trusted() as engine:
        made = engine.service.get("hourly-pay", tenant="acme")
    assert isinstance(made.trigger, IntervalTrigger)
    assert made.trigger.anchor_ms == anchor  # what the approver saw
    again = site.as_account(site.accounts.alice, *add)
    assert again.returncode == 5, again.stderr  # it exists: made once
    assert "already exists" in again.stderr


def test_a_sensitive_every_edit_without_start_completes_once_after_approval(
    site: Deployment,
) -> None:
    edit = ("schedule", "edit", "flagged", "--every", "2h", "--tenant", "acme")
    asked = _refused_pending(site, site.accounts.alice, *edit)
    assert _refused_pending(site, site.accounts.alice, *edit) == asked
    _approve(site, asked)
    done = site.as_account(site.accounts.alice, *edit)
    assert done.returncode == 0, done.stderr
    with site.trusted() as engine:
        trigger = engine.service.get("flagged", tenant="acme").trigger
    assert isinstance(trigger, IntervalTrigger)
    assert trigger.every_ms == 2 * HOUR_MS
    assert _approval(site, asked) is ApprovalState.CONSUMED


# -- requeue --------------------------------------------------------------------------------------


def test_requeueing_a_sensitive_dead_letter_needs_an_approval(site: Deployment) -> None:
    """The attacker's U1: a failed run of a protected schedule, requeued by one operator as
    often as it fails, is an execution nobody approved."""
    dead = _dead_letters(site)
    alice = site.accounts.alice
    everything = site.as_account(alice, "queue", "requeue", "--all", "--tenant", "acme")
    assert everything.returncode == 2, everything.stderr
    assert "requeue them by id" in everything.stderr
    assert _dead_letters(site) == dead
    plain = site.as_account(alice, "queue", "requeue", str(dead["report"]), "--tenant", "acme")
    assert plain.returncode == 0, plain.stderr
    asked = _refused_pending(
        site, alice, "queue", "requeue", str(dead["payroll"]), "--tenant", "acme"
    )
    assert _dead_letters(site) == {"payroll": dead["payroll"]}
    _approve(site, asked)
    done = site.as_account(alice, "queue", "requeue", str(dead["payroll"]), "--tenant", "acme")
    assert done.returncode == 0, done.stderr
    assert _dead_letters(site) == {}
    assert _approval(site, asked) is ApprovalState.CONSUMED
