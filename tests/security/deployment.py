"""The documented trust-boundary deployment, for the attack suite: `vortos run
--control-socket` as the service account (root, here) owns the database and the audit key;
throwaway Unix accounts, created per test, are the operators in the socket's group.

`Deployment.start` seeds the database as the service account (any `seed` callback gets a
trusted engine), then runs the server; `as_account` runs the CLI as one of the accounts, with
the privileges the kernel gives it and nothing else.
"""

from __future__ import annotations

import grp
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine import Engine, SystemClock, open_engine

ROOT = Path(__file__).resolve().parents[2]

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("groupadd") is None,
    reason="creates Unix accounts with useradd: run the tests as root (CI does) to enable",
)


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Accounts:
    """A group of operators (`alice`, `bob`, `carol`, in the group) and an outsider."""

    group: str
    alice: str
    bob: str
    carol: str
    outsider: str

    @property
    def gid(self) -> int:
        return grp.getgrnam(self.group).gr_gid


@contextmanager
def accounts() -> Iterator[Accounts]:
    suffix = secrets.token_hex(3)
    made = Accounts(
        f"vtops{suffix}", f"vta{suffix}", f"vtb{suffix}", f"vtc{suffix}", f"vtx{suffix}"
    )
    sh("groupadd", made.group)
    users: list[str] = []
    try:
        for user in (made.alice, made.bob, made.carol):
            sh("useradd", "-M", "-N", "-g", made.group, "-s", "/usr/sbin/nologin", user)
            users.append(user)
        sh("useradd", "-M", "-s", "/usr/sbin/nologin", made.outsider)
        users.append(made.outsider)
        yield made
    finally:
        for user in users:
            subprocess.run(["userdel", user], capture_output=True, check=False, timeout=30)
        subprocess.run(["groupdel", made.group], capture_output=True, check=False, timeout=30)
        subprocess.run(["groupdel", made.outsider], capture_output=True, check=False, timeout=30)


@dataclass
class Deployment:
    """A running service with its files under `base` (mode 0750, the operators' group)."""

    accounts: Accounts
    base: Path
    db: Path
    sock: Path
    log: Path
    server: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def as_account(
        self,
        user: str,
        *args: str,
        env: dict[str, str] | None = None,
        socket_on: bool = True,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`vortos --db DB ARGS` as `user` (see tests/integration/as_account.py)."""
        environment = {"PATH": os.environ.get("PATH", ""), "COLUMNS": "200", **(env or {})}
        if socket_on:
            environment["VORTOS_CONTROL_SOCKET"] = str(self.sock)
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.integration.as_account",
                user,
                "--",
                "--db",
                str(self.db),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
            cwd=ROOT,
            env=environment,
            input=input_text,
        )

    def trusted(self) -> Engine:
        """The database as the service account sees it (read-only: the server owns it)."""
        return open_engine(self.db, create=False, readonly=True)

    def start(self, *run_args: str, env: dict[str, str] | None = None) -> None:
        """Run `vortos run --control-socket` as the service account, until `stop`."""
        environment = {k: v for k, v in os.environ.items() if not k.startswith("VORTOS_")} | (
            env or {}
        )
        with self.log.open("ab") as out:
            self.server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vortos_tui.cli",
                    "--db",
                    str(self.db),
                    "run",
                    "--control-socket",
                    str(self.sock),
                    "--control-group",
                    self.accounts.group,
                    *run_args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=environment,
            )
        self._wait_for_socket()

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=60)
            self.server = None

    def _wait_for_socket(self) -> None:
        assert self.server is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                pytest.fail(f"vortos run exited {self.server.returncode}:\n{self.log.read_text()}")
            if self.sock.exists():
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    probe.connect(str(self.sock))
                except OSError:
                    pass
                else:
                    return
                finally:
                    probe.close()
            time.sleep(0.05)
        pytest.fail(f"the control socket never appeared:\n{self.log.read_text()}")


@contextmanager
def deployment(
    made: Accounts,
    seed: Callable[[Engine], None] | None = None,
    *,
    run_args: Sequence[str] = ("--no-consume",),
    env: dict[str, str] | None = None,
    start: bool = True,
) -> Iterator[Deployment]:
    """The README's layout in a temporary directory: seeded as the service account, then
    served. The directory is the group's, mode 0750 (the operators may enter it)."""
    base = Path(tempfile.mkdtemp(prefix="vt-sec-", dir="/tmp"))
    try:
        os.chown(base, 0, made.gid)
        base.chmod(0o750)
        db = base / "vortos.db"
        site = Deployment(made, base, db, base / "control.sock", base / "server.log")
        with open_engine(db, clock=SystemClock()) as trusted:
            if seed is not None:
                seed(trusted)
        os.chown(db, 0, made.gid)
        db.chmod(0o640)
        if start:
            site.start(*run_args, env=env)
        try:
            yield site
        finally:
            site.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def request_id(stderr: str) -> str:
    found = re.search(r"request (\w+) is pending", stderr)
    assert found, stderr
    return found.group(1)
