"""Denial of the control socket by one operator (issue 15): an operator in the socket's group
who holds connections open, each with half a request, and reopens any the server closes, must
not stop another operator's reads and changes (a pause in an incident, an approval). The
server counts connections by the account the kernel reports and refuses one over its cap at
once, and it cuts off a request that does not arrive whole within its deadline. Each test
names the promise it attacks.

Needs root (real Unix accounts); skipped with a reason otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine import Engine, IntervalTrigger, ScheduleSpec
from engine.control.server import ConnectionLimits
from engine.domain.access import Grant, Role
from engine.domain.timeutil import HOUR_MS
from tests.security.deployment import ROOT, Accounts, Deployment, deployment, needs_root

pytestmark = needs_root

LIMITS = ConnectionLimits()  # the server's defaults: what the deployment runs with
FLOOD = LIMITS.per_account + 24  # more than one account may hold


def _seed(made: Accounts) -> Any:
    def seed(engine: Engine) -> None:
        now = engine.clock.now_ms()
        for name in ("report", "ledger"):
            engine.service.create(
                ScheduleSpec(name, IntervalTrigger(HOUR_MS, now), "noop", tenant="acme"),
                actor="root",
            )
        for user in (made.alice, made.bob):
            engine.storage.operators.grant(Grant(user, Role.OPERATOR, "acme"), by="root", at=now)

    return seed


@pytest.fixture
def site(ops: Accounts) -> Iterator[Deployment]:
    with deployment(ops, _seed(ops)) as running:
        yield running


def _attacker(site: Deployment, mode: str, user: str, amount: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.security.socket_flood",
            mode,
            user,
            str(site.sock),
            amount,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _until(what: str, check: Any, *, within_s: float = 90.0) -> Any:
    """Poll `check` until it returns something true, or fail saying `what` never happened."""
    deadline = time.monotonic() + within_s
    while True:
        done = check()
        if done:
            return done
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {within_s:.0f}s: last {done!r}")


def _succeeds(site: Deployment, user: str, *args: str) -> str | None:
    """Its output (or "ok") if the command succeeded as `user`; None if it failed."""
    done = site.as_account(user, *args)
    return (done.stdout or "ok") if done.returncode == 0 else None


def _status(site: Deployment, name: str) -> str:
    with site.trusted() as engine:
        return engine.service.get(name, tenant="acme").status.value


def test_one_account_flooding_the_socket_cannot_stop_anothers_list_and_pause(
    site: Deployment,
) -> None:
    ops = site.accounts
    flooder = _attacker(site, "flood", ops.bob, str(FLOOD))
    try:
        assert flooder.stdout is not None
        assert flooder.stdout.readline().strip() == "ready", flooder.stderr
        # While bob holds every connection his account may: alice is served.
        listed = site.as_account(ops.alice, "schedule", "list", "--tenant", "acme")
        assert listed.returncode == 0, listed.stderr
        assert "report" in listed.stdout
        paused = site.as_account(ops.alice, "schedule", "pause", "report", "--tenant", "acme")
        assert paused.returncode == 0, paused.stderr
        assert _status(site, "report") == "paused"
        # Bob's own call is refused at once, in one line that says why.
        his = site.as_account(ops.bob, "schedule", "list", "--tenant", "acme")
        assert his.returncode == 1, his.stderr
        assert his.stderr.strip() == (
            f"error: too many connections from your account ({LIMITS.per_account} open): "
            "close some and retry"
        )
        assert flooder.poll() is None, "the flood ended before the checks"
    finally:
        out, err = flooder.communicate(timeout=60)
    stats = json.loads(out.splitlines()[-1])
    # The flooder's connections over the cap were answered "too many connections", not
    # queued: the accept loop went on taking connections.
    refused = stats["answers"].get(
        f"too many connections from your account ({LIMITS.per_account} open): close some and retry",
        0,
    )
    assert refused >= FLOOD - LIMITS.per_account, (stats, err)
    # After the flood: everything works, for the flooder too (his slots are free again).
    _until(
        "bob's resume did not succeed after the flood",
        lambda: _succeeds(site, ops.bob, "schedule", "resume", "report", "--tenant", "acme"),
    )
    assert _status(site, "report") == "active"
    listed = site.as_account(ops.alice, "schedule", "list", "--tenant", "acme")
    assert listed.returncode == 0, listed.stderr


def test_a_slow_sender_is_cut_off_at_the_request_deadline_not_kept_by_a_byte_now_and_then(
    site: Deployment,
) -> None:
    # A byte a second would keep a connection for ever under a per-receive timeout alone.
    trickler = _attacker(site, "trickle", site.accounts.bob, "1")
    out, err = trickler.communicate(timeout=120)
    assert trickler.returncode == 0, err
    cut = json.loads(out.splitlines()[-1])
    assert LIMITS.request_s - 1 <= cut["open_s"] <= LIMITS.request_s + 30, cut
    answer = json.loads(cut["answer"])
    assert answer["ok"] is False
    assert f"no whole request within {LIMITS.request_s:.0f}s" in answer["error"]["message"]
