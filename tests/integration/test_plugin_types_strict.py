"""Plug-ins written against engine.extend type-check under `mypy --strict`, as their authors
run it: a lease driver, a doctor check and a policy that wraps the built-in one, and the
example plug-in package (examples/plugins). engine is found as an installed package is (its
py.typed marker; its own errors are not the plug-in's), and a plug-in that gets a port wrong
is an error, so the check is not passing on Any."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USER_PLUGINS = '''
from __future__ import annotations

import threading

from engine.extend import (
    Clock,
    Decision,
    DoctorCheck,
    DoctorContext,
    Finding,
    Identity,
    Lease,
    LeaseExpired,
    LeaseNotOwned,
    LeasePort,
    Operation,
    PluginContext,
    PluginError,
    Policy,
    Status,
)


class MemoryLease:
    """Leases in a dict, for one process."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.leases: dict[str, Lease] = {}
        self.lock = threading.Lock()

    def current(self, key: str) -> Lease | None:
        lease = self.leases.get(key)
        return lease if lease is not None and lease.expires_at > self.clock.now_ms() else None

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        with self.lock:
            held = self.current(key)
            if held is not None and held.token != token:
                return None
            now = self.clock.now_ms()
            lease = Lease(key, token, holder, now, now, now + ttl_ms)
            self.leases[key] = lease
            return lease

    def renew(self, key: str, token: str, ttl_ms: int) -> Lease:
        with self.lock:
            lease = self.leases.get(key)
            if lease is None or lease.token != token:
                raise LeaseNotOwned(key)
            now = self.clock.now_ms()
            if lease.expires_at <= now:
                raise LeaseExpired(key)
            renewed = Lease(key, token, lease.holder, lease.acquired_at, now, now + ttl_ms)
            self.leases[key] = renewed
            return renewed

    def release(self, key: str, token: str) -> None:
        with self.lock:
            lease = self.leases.get(key)
            if lease is not None and lease.token == token:
                del self.leases[key]


def memory_lease(context: PluginContext) -> LeasePort:
    return MemoryLease(context.clock)


class LeaseTtlCheck:
    """Warns when the lease_ttl setting is longer than the plug-in's max_ttl_ms option."""

    check_id = "mine.lease_ttl"

    def __init__(self, context: PluginContext) -> None:
        limit = context.options.get("max_ttl_ms", 60_000)
        if not isinstance(limit, int):
            raise PluginError(f"[plugin.{context.name}] max_ttl_ms must be an integer")
        self.limit = limit
        self.ttl = None if context.settings is None else context.settings.lease_ttl

    def run(self, ctx: DoctorContext) -> Finding:
        if self.ttl is not None and self.ttl > self.limit:
            return Finding(self.check_id, Status.WARN, f"lease_ttl is {self.ttl} ms")
        return Finding(self.check_id, Status.PASS, "lease_ttl is short enough")


def lease_ttl_check(context: PluginContext) -> DoctorCheck:
    return LeaseTtlCheck(context)


class FrozenTenants:
    """The built-in policy, with tenants nobody may change."""

    def __init__(self, context: PluginContext) -> None:
        default = context.default
        if not isinstance(default, Policy):
            raise PluginError(f"{context.setting} = {context.name!r} wraps the built-in policy")
        self.default = default
        frozen = context.options.get("frozen", [])
        self.frozen = {str(t) for t in frozen} if isinstance(frozen, list) else set()

    def decide(self, identity: Identity, operation: Operation, tenant: str | None) -> Decision:
        if tenant in self.frozen and not operation.value.startswith("view"):
            return Decision(False, f"tenant {tenant} is frozen")
        return self.default.decide(identity, operation, tenant)


def frozen_tenants(context: PluginContext) -> Policy:
    return FrozenTenants(context)
'''

# The same lease with renew's ttl as text and a release that forgot its token: not a
# LeasePort, which mypy must say.
WRONG_PLUGIN = """
from __future__ import annotations

from engine.extend import Lease, LeasePort, PluginContext


class HalfLease:
    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        return None

    def renew(self, key: str, token: str, ttl_ms: str) -> Lease:
        raise NotImplementedError

    def release(self, key: str) -> None:
        return None

    def current(self, key: str) -> Lease | None:
        return None


def half_lease(context: PluginContext) -> LeasePort:
    return HalfLease()


def node(context: PluginContext) -> int:
    return context.options["port"]
"""


def strict_mypy(tmp_path: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    """mypy --strict on `targets` from `tmp_path` (no project configuration there), with
    engine and the example package found on MYPYPATH and their own errors silenced, as an
    installed package's are."""
    env = {**os.environ, "MYPYPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples/plugins")])}
    command = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent"]
    command += ["--cache-dir", str(tmp_path / ".mypy_cache"), "--python-version", "3.11"]
    return subprocess.run(
        [*command, *targets],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_engine_ships_its_types() -> None:
    # Without the PEP 561 marker an installed engine is untyped to mypy: every name a plug-in
    # imports from engine.extend would be Any.
    assert (ROOT / "engine" / "py.typed").is_file()


def test_user_plugins_against_engine_extend_pass_mypy_strict(tmp_path: Path) -> None:
    (tmp_path / "user_plugins.py").write_text(textwrap.dedent(USER_PLUGINS), encoding="utf-8")

    done = strict_mypy(tmp_path, "user_plugins.py")

    assert done.returncode == 0, done.stdout + done.stderr


def test_the_example_plugin_package_passes_mypy_strict(tmp_path: Path) -> None:
    done = strict_mypy(tmp_path, "-p", "vortos_example_plugins")

    assert done.returncode == 0, done.stdout + done.stderr


def test_a_plugin_that_gets_its_port_wrong_fails_mypy_strict(tmp_path: Path) -> None:
    text = textwrap.dedent(WRONG_PLUGIN)
    (tmp_path / "wrong_plugin.py").write_text(text, encoding="utf-8")
    option_line = text.splitlines().index('    return context.options["port"]') + 1

    done = strict_mypy(tmp_path, "wrong_plugin.py")

    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Incompatible return value type (got "HalfLease", expected "LeasePort")' in done.stdout
    # An option is a TOML value, not an int, until the plug-in checks it.
    assert f"wrong_plugin.py:{option_line}: error: Incompatible return value type" in done.stdout
    assert done.stdout.count(": error:") == 2, done.stdout
