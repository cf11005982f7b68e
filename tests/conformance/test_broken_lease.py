"""The shipped lease suite catches a broken lease, naming the guarantee it breaks.

A user's test module, written here as a user would write one, runs the suite under pytest in a
process of its own: once on a small correct in-memory lease, which passes every test, and once
on each deliberately broken variant of it, each of which must fail with the broken guarantee
named in the failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.testing.conformance.lease import LeaseConformance

USER_MODULE = "test_user_leases"

# What a user writes: a lease of their own, and the suite subclassed on it. The broken variants
# each break one guarantee of the correct one.
USER_SOURCE = '''
"""A user's in-memory leases under the shipped suite."""

import threading
from contextlib import nullcontext
from dataclasses import replace

from engine.domain.errors import LeaseExpired, LeaseNotOwned
from engine.ports.lease import Lease
from engine.testing.conformance import LeaseConformance


class MemoryLease:
    """A dict of leases guarded by a lock, their expiry judged on the given clock."""

    def __init__(self, clock):
        self.clock = clock
        self.leases = {}
        self.lock = threading.Lock()

    def live(self, key, now):
        lease = self.leases.get(key)
        return lease if lease is not None and lease.expires_at > now else None

    def acquire(self, key, token, holder, ttl_ms):
        with self.lock:
            now = self.clock.now_ms()
            live = self.live(key, now)
            if live is not None and live.token != token:
                return None
            acquired_at = now if live is None else live.acquired_at
            lease = Lease(key, token, holder, acquired_at, now, now + ttl_ms)
            self.leases[key] = lease
            return lease

    def renew(self, key, token, ttl_ms):
        with self.lock:
            now = self.clock.now_ms()
            live = self.live(key, now)
            if live is None:
                stored = self.leases.get(key)
                if stored is not None and stored.token == token:
                    raise LeaseExpired(key)
                raise LeaseNotOwned(key)
            if live.token != token:
                raise LeaseNotOwned(key)
            lease = replace(live, renewed_at=now, expires_at=now + ttl_ms)
            self.leases[key] = lease
            return lease

    def release(self, key, token):
        with self.lock:
            live = self.live(key, self.clock.now_ms())
            if live is not None and live.token != token:
                raise LeaseNotOwned(key)
            self.leases.pop(key, None)

    def current(self, key):
        with self.lock:
            return self.live(key, self.clock.now_ms())


class GrantsTwoHolders(MemoryLease):
    """Broken: grants a held key to a second token, which takes it over."""

    def acquire(self, key, token, holder, ttl_ms):
        with self.lock:
            now = self.clock.now_ms()
            lease = Lease(key, token, holder, now, now, now + ttl_ms)
            self.leases[key] = lease
            return lease


class RenewResurrects(MemoryLease):
    """Broken: renews its token's expired lease as if it were live, when nobody took it."""

    def renew(self, key, token, ttl_ms):
        with self.lock:
            now = self.clock.now_ms()
            stored = self.leases.get(key)
            if stored is None or stored.token != token:
                raise LeaseNotOwned(key)
            lease = replace(stored, renewed_at=now, expires_at=now + ttl_ms)
            self.leases[key] = lease
            return lease


class ReleasedByAnyone(MemoryLease):
    """Broken: lets any token release the lease."""

    def release(self, key, token):
        with self.lock:
            self.leases.pop(key, None)


class NeverExpires(MemoryLease):
    """Broken: a lease lasts until it is released."""

    def live(self, key, now):
        return self.leases.get(key)


class TestMemoryLease(LeaseConformance):
    def open_leases(self, clock):
        return nullcontext(MemoryLease(clock))


class TestGrantsTwoHolders(LeaseConformance):
    def open_leases(self, clock):
        return nullcontext(GrantsTwoHolders(clock))


class TestRenewResurrects(LeaseConformance):
    def open_leases(self, clock):
        return nullcontext(RenewResurrects(clock))


class TestReleasedByAnyone(LeaseConformance):
    def open_leases(self, clock):
        return nullcontext(ReleasedByAnyone(clock))


class TestNeverExpires(LeaseConformance):
    def open_leases(self, clock):
        return nullcontext(NeverExpires(clock))
'''

SUITE_TESTS = sorted(name for name in dir(LeaseConformance) if name.startswith("test_"))


@dataclass(frozen=True)
class Broken:
    """A broken variant: its class in the user's module, the guarantee it breaks, and a test
    of the suite that checks exactly that guarantee."""

    cls: str
    guarantee: str
    checked_by: str


BROKEN = [
    Broken(
        "TestGrantsTwoHolders",
        "mutual exclusion",
        "test_acquire_is_refused_while_another_token_holds_the_key",
    ),
    Broken(
        "TestRenewResurrects",
        "renew never resurrects an expired lease",
        "test_renew_after_expiry_raises_expired_even_if_nobody_took_it",
    ),
    Broken(
        "TestReleasedByAnyone",
        "release by a non-holder must raise LeaseNotOwned and leave the lease",
        "test_release_with_another_token_raises_not_owned",
    ),
    Broken("TestNeverExpires", "expiry", "test_current_is_none_once_the_lease_expired"),
]


@dataclass
class Outcome:
    """What became of each test of one class of the user's module."""

    passed: set[str] = field(default_factory=set)
    # test name -> the failure's message; errors and skips are kept apart from failures.
    failed: dict[str, str] = field(default_factory=dict)
    other: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    output: str
    outcomes: dict[str, Outcome]


@pytest.fixture(scope="module")
def user_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The user's module run by pytest in a process of its own."""
    directory = tmp_path_factory.mktemp("user")
    (directory / f"{USER_MODULE}.py").write_text(USER_SOURCE)
    report = directory / "report.xml"
    # The user's run, not ours: none of our pytest options or test servers leak into it.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VORTOS_"))}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={report}",
            f"{USER_MODULE}.py",
        ],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    output = done.stdout + done.stderr
    assert report.exists(), f"pytest wrote no report (exit {done.returncode}):\n{output}"
    return Run(output, _outcomes(report))


def _outcomes(report: Path) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 - our own report
        cls = case.get("classname", "").rpartition(".")[2]
        name = case.get("name", "")
        outcome = outcomes.setdefault(cls, Outcome())
        failure = case.find("failure")
        problems = [found for tag in ("error", "skipped") if (found := case.find(tag)) is not None]
        if failure is not None:
            outcome.failed[name] = failure.get("message", "")
        elif problems:
            outcome.other[name] = f"{problems[0].tag}: {problems[0].get('message', '')}"
        else:
            outcome.passed.add(name)
    return outcomes


def test_a_correct_lease_passes_every_test_of_the_suite(user_run: Run) -> None:
    outcome = user_run.outcomes.get("TestMemoryLease", Outcome())

    assert sorted(outcome.passed) == SUITE_TESTS, (
        f"failed: {outcome.failed}\nother: {outcome.other}\n{user_run.output}"
    )


@pytest.mark.parametrize("broken", BROKEN, ids=lambda b: b.cls)
def test_a_broken_lease_fails_the_suite_naming_the_broken_guarantee(
    user_run: Run, broken: Broken
) -> None:
    outcome = user_run.outcomes.get(broken.cls, Outcome())

    assert not outcome.other, f"{broken.cls} errored rather than failed: {outcome.other}"
    assert outcome.failed, f"{broken.cls} passed the suite:\n{user_run.output}"
    assert broken.checked_by in outcome.failed, (
        f"{broken.checked_by} did not fail on {broken.cls}; failed: {sorted(outcome.failed)}"
    )
    assert outcome.failed[broken.checked_by].split(": ", 1)[1].startswith(broken.guarantee), (
        f"{broken.checked_by} failed without naming {broken.guarantee!r}: "
        f"{outcome.failed[broken.checked_by]}"
    )
    assert f"{broken.guarantee}:" in user_run.output


def test_the_two_holders_lease_fails_every_exclusion_check_naming_mutual_exclusion(
    user_run: Run,
) -> None:
    failed = user_run.outcomes.get("TestGrantsTwoHolders", Outcome()).failed
    exclusion = [name for name, message in failed.items() if "mutual exclusion:" in message]

    # The acquire checks, the thread race and the second client all see the second holder.
    assert {
        "test_acquire_is_refused_while_another_token_holds_the_key",
        "test_lease_not_yet_expired_blocks_another_token",
        "test_another_client_is_refused_while_the_key_is_held",
        "test_threads_racing_to_acquire_a_free_key_yield_exactly_one_holder",
    } <= set(exclusion), f"failed: {failed}"
