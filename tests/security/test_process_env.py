"""Attacks on the `process` command by a hostile operator (finding 1 of issue 15): through
payloads sent over the control socket, reach the service's account (loader and interpreter
variables, a working directory outside what the owner allows) or read what the service holds
in its environment (the audit key, a database password).

The deployment is the README's: `vortos run --control-socket` with consumers, as the service
account (root, here), whose environment holds the process allowlists, VORTOS_AUDIT_KEY and a
database URL with a password; the operators are real Unix accounts in the socket's group, each
with the operator role in the default tenant. Refused attempts are checked to change nothing
stored: the schedules, the approvals, every tenant chain's head and the attacker's audit entries
are the same before and after.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, IntervalTrigger, ScheduleSpec
from engine.control.wire import VERSION
from engine.domain.access import Grant, Role
from engine.domain.timeutil import DAY_MS
from tests.security.deployment import ROOT, Accounts, Deployment, accounts, deployment, needs_root

ENV = "/usr/bin/env"
ECHO = "/bin/echo"
AUDIT_KEY = secrets.token_hex(32)
DB_PASSWORD = "hunter2-" + secrets.token_hex(4)
SECRET_URL = f"postgresql://svc:{DB_PASSWORD}@db.internal/prod"
ALLOWED_NAME = "BACKUP_TARGET"
WAIT_S = 90.0  # the most a test waits for a run; reached only when it fails
# A one-shot schedule's lead time: long enough to add it and swap a link before it fires.
FIRE_IN_S = 15

pytestmark = [
    needs_root,
    pytest.mark.skipif(
        not all(os.access(p, os.X_OK) for p in (ENV, ECHO)), reason="needs coreutils"
    ),
]


class Site:
    """The running service, its allowed working directory, and who attacks it."""

    def __init__(self, made: Accounts, served: Deployment, jobs: Path) -> None:
        self.accounts = made
        self.served = served
        self.jobs = jobs
        self.attacker = made.alice

    def cli(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.served.as_account(self.attacker, *args, env=env)

    def add(
        self, name: str, payload: dict[str, Any], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.cli(
            *("schedule", "add", name, "--every", "1d", "--command", "process"),
            *("--payload", json.dumps(payload)),
            env=env,
        )

    def raw(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """A hand-written request over the socket as the attacker: no CLI check in between."""
        request = json.dumps({"v": VERSION, "op": op, "args": args})
        done = subprocess.run(
            [sys.executable, "-m", "tests.security.raw_request", self.attacker, str(self.sock)],
            input=request,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer

    @property
    def sock(self) -> Path:
        return self.served.sock

    def stored(self) -> tuple[list[Any], ...]:
        """Every schedule row, every approval, each tenant chain's head, and every audit entry
        the attacker made. (The system chain is left out: the service's own daemon appends to it,
        leadership and the like, at moments of its own.)"""
        with sqlite3.connect(self.served.db) as db:
            return (
                db.execute("SELECT * FROM schedules ORDER BY id").fetchall(),
                db.execute("SELECT * FROM approvals ORDER BY id").fetchall(),
                db.execute(
                    "SELECT chain, seq, hash FROM audit_entries a WHERE chain LIKE 'tenant:%' "
                    "AND seq = (SELECT max(seq) FROM audit_entries b WHERE b.chain = a.chain) "
                    "ORDER BY chain"
                ).fetchall(),
                db.execute(
                    "SELECT chain, seq FROM audit_entries WHERE actor = ? ORDER BY chain, seq",
                    (self.attacker,),
                ).fetchall(),
            )

    def wait_for_static_sync(self) -> None:
        """Until the built-in static schedules (retention, anchors) are stored."""
        deadline = time.monotonic() + WAIT_S
        while True:
            with sqlite3.connect(self.served.db) as db:
                names = {
                    r[0]
                    for r in db.execute(
                        "SELECT name FROM schedules WHERE tenant = 'system' AND origin = 'static'"
                    )
                }
            if {"vortos.prune", "vortos.audit-anchor"} <= names:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"the service never synced its static schedules: {sorted(names)}")
            time.sleep(0.05)

    def runs(self, name: str) -> list[Any]:
        with sqlite3.connect(self.served.db) as db:
            return db.execute("SELECT * FROM runs WHERE schedule_name = ?", (name,)).fetchall()

    def finished_run(self, name: str, kind: str = "manual") -> tuple[str, str | None, str | None]:
        """(state, output, error) of the schedule's run of `kind`, once it has finished."""
        deadline = time.monotonic() + WAIT_S
        while True:
            with sqlite3.connect(self.served.db) as db:
                row = db.execute(
                    "SELECT state, output, error FROM runs WHERE schedule_name = ? "
                    "AND kind = ? AND state NOT IN ('dispatched', 'running')",
                    (name, kind),
                ).fetchone()
            if row is not None:
                return row[0], row[1], row[2]
            if time.monotonic() > deadline:
                pytest.fail(f"the run of {name} never finished:\n{self.served.log.read_text()}")
            time.sleep(0.1)


def _seed(made: Accounts) -> Any:
    def seed(trusted: Engine) -> None:
        now = trusted.clock.now_ms()
        trusted.storage.operators.grant(Grant("root", Role.ADMIN, "*"), by="root", at=now)
        trusted.storage.operators.grant(
            Grant(made.alice, Role.OPERATOR, "default"), by="root", at=now
        )

    return seed


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    """One service for the module's attempts (each leaves it as it found it, or makes its own
    schedule): accounts and a server cost seconds each on this machine."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("creates Unix accounts with useradd: run the tests as root (CI does)")
    jobs = Path(tempfile.mkdtemp(prefix="vt-jobs-", dir="/tmp"))
    (jobs / "real").mkdir()
    service_env = {
        "VORTOS_PROCESS_ALLOW": os.pathsep.join([ENV, ECHO]),
        "VORTOS_PROCESS_ENV_ALLOW": ALLOWED_NAME,
        "VORTOS_PROCESS_CWD_ALLOW": str(jobs),
        "VORTOS_AUDIT_KEY": AUDIT_KEY,
        "DATABASE_URL": SECRET_URL,
        "LANG": "C.UTF-8",
    }
    try:
        with (
            accounts() as made,
            pytest.MonkeyPatch.context() as patch,
        ):
            patch.setenv("VORTOS_AUDIT_KEY", AUDIT_KEY)  # the seed signs with the service's key
            with deployment(
                made, _seed(made), run_args=("--consumers", "2"), env=service_env
            ) as served:
                site = Site(made, served, jobs)
                # The service answers on its socket before its start-up sync has written the
                # built-in static schedules: a test's "before" taken in between saw none.
                site.wait_for_static_sync()
                yield site
    finally:
        shutil.rmtree(jobs, ignore_errors=True)


def _refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    said = " ".join(done.stderr.split())  # as one line, however the terminal wrapped it
    for needle in needles:
        assert needle in said, done.stderr


def _raw_refused(answer: dict[str, Any], *needles: str) -> None:
    assert answer.get("ok") is not True, answer
    error = answer["error"]
    assert (error["type"], error["exit_code"]) == ("InvalidInput", 2), error
    for needle in needles:
        assert needle in error["message"], error


def _spec_json(name: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A create request's spec, with `payload` put in as it is (NUL bytes and all)."""
    spec = ScheduleSpec(name, IntervalTrigger(DAY_MS, 0), "process", {"argv": [ECHO]}).to_json()
    spec["payload"] = payload
    return spec


# --- loader, interpreter and shell variables ---------------------------------------------------

LOADER_AND_INTERPRETER = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "BASH_ENV",
    "ENV",
    "PATH",
    "IFS",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "NODE_OPTIONS",
    "PERL5OPT",
    "ld_preload",
    "Ld_Preload",
    "pythonPath",
    "VORTOS_AUDIT_KEY",
]


@pytest.mark.parametrize("name", LOADER_AND_INTERPRETER)
def test_an_operator_cannot_add_a_loader_or_interpreter_variable_through_the_cli(
    site: Site, name: str
) -> None:
    """Promise: no payload sets a variable that makes a program, interpreter, shell or the loader
    run code of the operator's choosing as the service; refused at add (exit 2), nothing stored."""
    before = site.stored()
    done = site.add("evil", {"argv": [ENV], "env": {name: f"{site.jobs}/evil.so"}})
    _refused(done, f"process env name {name!r} can never be set", "remove it from the payload")
    assert site.stored() == before


@pytest.mark.parametrize("name", LOADER_AND_INTERPRETER)
def test_a_hand_written_create_with_a_loader_variable_is_refused_by_the_server(
    site: Site, name: str
) -> None:
    """Promise: the server checks every payload with its own registry, whatever the client did
    (or did not) check: a raw `create` over the socket is refused the same way, nothing stored."""
    before = site.stored()
    answer = site.raw(
        "create", {"spec": _spec_json("evil", {"argv": [ENV], "env": {name: "/tmp/evil.so"}})}
    )
    _raw_refused(answer, f"process env name {name!r} can never be set")
    assert site.stored() == before


def test_an_operator_cannot_edit_a_schedule_to_add_ld_preload(site: Site) -> None:
    """Promise: `schedule edit --payload` is checked as `add` is (exit 2, the row unchanged)."""
    done = site.add("edited", {"argv": [ECHO, "fine"]})
    assert done.returncode == 0, done.stderr
    before = site.stored()
    payload = {"argv": [ECHO, "fine"], "env": {"LD_PRELOAD": "/tmp/evil.so"}}
    edited = site.cli("schedule", "edit", "edited", "--payload", json.dumps(payload))
    _refused(edited, "'LD_PRELOAD' can never be set")
    raw = site.raw("update", {"spec": _spec_json("edited", payload)})
    _raw_refused(raw, "'LD_PRELOAD' can never be set")
    assert site.stored() == before


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"A-B": "x"}, "is not allowed: a name is letters"),
        ({"A=B": "x"}, "is not allowed: a name is letters"),
        ({"BASH_FUNC_ls%%": "() { id; }"}, "is not allowed: a name is letters"),
        ({"": "x"}, "is not allowed: a name is letters"),
        ({"LD_PRELOAD\x00": "x"}, "cannot contain a NUL character"),
        ({ALLOWED_NAME: "a\x00b"}, "cannot contain a NUL character"),
        ({"Backup_Target": "x"}, "is not on the service's process_env_allow list"),
    ],
    ids=["dash", "equals", "exported-function", "empty", "nul-in-name", "nul-in-value", "case"],
)
def test_names_with_odd_characters_or_nul_bytes_are_refused_by_the_server(
    site: Site, env: dict[str, str], needle: str
) -> None:
    """Promise: a name the loader or a shell could read another way (with `=`, `%%`, NUL, or
    another case than the owner allowed) is refused at add, exit 2, nothing stored."""
    before = site.stored()
    _raw_refused(
        site.raw("create", {"spec": _spec_json("odd", {"argv": [ENV], "env": env})}), needle
    )
    assert site.stored() == before


def test_a_nul_byte_in_an_argument_is_refused(site: Site) -> None:
    """Promise: an argument cannot be cut short at a NUL to smuggle a different one in."""
    before = site.stored()
    answer = site.raw("create", {"spec": _spec_json("nul", {"argv": [ECHO, "a\x00-n"]})})
    _raw_refused(answer, "cannot contain a NUL character")
    assert site.stored() == before


# --- the operator's own environment widens nothing -----------------------------------------------


def test_an_operators_own_env_allowlist_does_not_widen_the_servers(site: Site) -> None:
    """Promise: with a control socket the server's process_env_allow decides; an operator's
    VORTOS_PROCESS_ENV_ALLOW changes nothing (refused by the server, exit 2, nothing stored)."""
    before = site.stored()
    done = site.add(
        "widened",
        {"argv": [ENV], "env": {"OPERATORS_CHOICE": "x"}},
        env={"VORTOS_PROCESS_ENV_ALLOW": "OPERATORS_CHOICE"},
    )
    _refused(done, "'OPERATORS_CHOICE' is not on the service's process_env_allow list")
    assert f"allowed: {ALLOWED_NAME}" in done.stderr  # the server's list, not the operator's
    assert site.stored() == before


def test_an_operators_own_executable_allowlist_does_not_widen_the_servers(site: Site) -> None:
    """Promise: an operator's VORTOS_PROCESS_ALLOW (or --allow-exec) cannot make the service run
    a program its owner did not allow."""
    before = site.stored()
    payload = {"argv": ["/bin/sh", "-c", "id > /tmp/pwned"]}
    done = site.add("shell", payload, env={"VORTOS_PROCESS_ALLOW": "/bin/sh"})
    _refused(done, "'/bin/sh' is not on the process allowlist")
    flagged = site.cli(
        *("--allow-exec", "/bin/sh", "schedule", "add", "shell", "--every", "1d"),
        *("--command", "process", "--payload", json.dumps(payload)),
    )
    _refused(flagged, "'/bin/sh' is not on the process allowlist")
    assert site.stored() == before
    assert not Path("/tmp/pwned").exists()


def test_an_operator_asking_for_ld_preload_in_their_own_settings_is_refused_at_start(
    site: Site,
) -> None:
    """Promise: process_env_allow can never name a loader variable, not even in an operator's
    own environment (the CLI stops at start, exit 2, before it connects)."""
    before = site.stored()
    done = site.add(
        "evil",
        {"argv": [ENV], "env": {"LD_PRELOAD": "/tmp/evil.so"}},
        env={"VORTOS_PROCESS_ENV_ALLOW": "LD_PRELOAD"},
    )
    _refused(done, "VORTOS_PROCESS_ENV_ALLOW='LD_PRELOAD' is refused", "can never be allowed")
    assert site.stored() == before


# --- the working directory ---------------------------------------------------------------------


def test_a_cwd_escaping_the_allowed_directory_by_dot_dot_is_refused(site: Site) -> None:
    """Promise: a cwd is resolved before it is checked: `allowed/real/../../..` is outside it."""
    before = site.stored()
    done = site.add("up", {"argv": [ENV], "cwd": f"{site.jobs}/real/../../../root"})
    _refused(done, "is outside the directories the service allows", "it resolves to '/root'")
    assert site.stored() == before


def test_a_cwd_symlink_out_of_the_allowed_directory_is_refused(site: Site) -> None:
    """Promise: a symlink inside the allowed directory that points out of it is refused."""
    (site.jobs / "out").symlink_to("/root")
    before = site.stored()
    done = site.add("linked", {"argv": [ENV], "cwd": str(site.jobs / "out")})
    _refused(done, "is outside the directories the service allows", "'/root'")
    assert site.stored() == before


def test_a_cwd_symlink_swapped_after_add_is_refused_at_trigger(site: Site) -> None:
    """Promise: the cwd is resolved again when a run is asked for: a link pointing inside at add
    and swapped to /root afterwards makes `schedule trigger` fail (exit 2), no run made."""
    link = site.jobs / "work"
    link.symlink_to(site.jobs / "real")
    added = site.add("swapped", {"argv": [ENV], "cwd": str(link)})
    assert added.returncode == 0, added.stderr
    link.unlink()
    link.symlink_to("/root")
    before = site.stored()
    triggered = site.cli("schedule", "trigger", "swapped")
    _refused(triggered, "outside the directories the service allows", "it resolves to '/root'")
    assert site.stored() == before
    assert site.runs("swapped") == []


def test_a_cwd_symlink_swapped_before_a_scheduled_fire_does_not_run_outside(site: Site) -> None:
    """Promise: the consumer resolves the cwd again before each run, and the child gets the
    path resolved then: a link swapped to /root between add and the fire fails the run, and the
    program never starts (env would have printed its environment)."""
    link = site.jobs / "later"
    link.symlink_to(site.jobs / "real")
    due = time.time() + FIRE_IN_S
    at = datetime.fromtimestamp(due, UTC).isoformat(timespec="seconds")
    added = site.cli(
        *("schedule", "add", "later", "--at", at, "--command", "process"),
        *("--payload", json.dumps({"argv": [ENV], "cwd": str(link)})),
    )
    assert added.returncode == 0, added.stderr
    link.unlink()
    link.symlink_to("/root")
    assert time.time() < due - 1, "the machine took the whole lead time to add the schedule"
    state, output, error = site.finished_run("later", kind="scheduled")
    assert state in ("failed", "dead_lettered"), (state, error)
    assert "outside the directories the service allows" in (error or "")
    assert output is None


def test_a_cwd_inside_the_allowed_directory_runs_there(site: Site) -> None:
    """Promise (the control for the refusals above): an allowed cwd is honoured."""
    (site.jobs / "inside").mkdir()
    added = site.add("inside", {"argv": ["/usr/bin/env", "pwd"], "cwd": str(site.jobs / "inside")})
    # /usr/bin/env runs `pwd` found on the child's fixed PATH.
    assert added.returncode == 0, added.stderr
    assert site.cli("schedule", "trigger", "inside").returncode == 0
    state, output, _ = site.finished_run("inside")
    assert state == "completed"
    assert str(site.jobs / "inside") in (output or "")


# --- what the child gets -----------------------------------------------------------------------


IDEMPOTENCY_KEY = "VORTOS_IDEMPOTENCY_KEY"


def test_the_child_gets_none_of_the_services_environment(site: Site) -> None:
    """Promise: a process child's environment is the minimal base (PATH, LANG, HOME, TZ), the
    fire's idempotency key and the payload's allowed variables, never the service's own: no
    other VORTOS_* variable, no audit key, no database password, read back from the run's
    output tail in the ledger."""
    added = site.add("printenv", {"argv": [ENV], "env": {ALLOWED_NAME: "s3://bucket/nightly"}})
    assert added.returncode == 0, added.stderr
    assert site.cli("schedule", "trigger", "printenv").returncode == 0
    state, output, error = site.finished_run("printenv")
    assert state == "completed", error
    assert output is not None
    lines = [line for line in output.splitlines() if not line.startswith("--- stdout")]
    seen = dict(line.split("=", 1) for line in lines)
    # The one variable Vortos sets itself: the fire's idempotency key (its slot key).
    assert set(seen) <= {"PATH", "LANG", "HOME", "TZ", ALLOWED_NAME, IDEMPOTENCY_KEY}, seen
    assert seen["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert seen[ALLOWED_NAME] == "s3://bucket/nightly"
    assert "@manual:" in seen[IDEMPOTENCY_KEY], seen  # a trigger's slot key: SCHEDULE@manual:...
    assert "VORTOS_" not in output.replace(f"{IDEMPOTENCY_KEY}=", "")
    assert AUDIT_KEY not in output
    assert DB_PASSWORD not in output
    assert "DATABASE_URL" not in output


def test_shell_metacharacters_in_arguments_reach_the_program_literally(site: Site) -> None:
    """Promise: no shell is involved: `;`, `$(...)`, backquotes and redirections in an argument
    are text, and nothing they spell is run."""
    marker = Path(f"/tmp/vt-pwned-{secrets.token_hex(4)}")
    arguments = [f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", f"> {marker}"]
    added = site.add("literal", {"argv": [ECHO, *arguments]})
    assert added.returncode == 0, added.stderr
    assert site.cli("schedule", "trigger", "literal").returncode == 0
    state, output, error = site.finished_run("literal")
    assert state == "completed", error
    assert " ".join(arguments) in (output or "")
    assert not marker.exists()


def test_a_service_started_with_ld_preload_on_its_env_allowlist_refuses_to_start(
    tmp_path: Path,
) -> None:
    """Promise: the owner cannot allow a loader variable either: `vortos run` stops at start
    (exit 2), naming the variable, before it opens the database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VORTOS_")}
    env["VORTOS_PROCESS_ENV_ALLOW"] = "BACKUP_TARGET,LD_PRELOAD"
    db = tmp_path / "vortos.db"
    done = subprocess.run(
        [sys.executable, "-m", "vortos_tui.cli", "--db", str(db), "run", "--no-consume"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=ROOT,
        env=env,
    )
    _refused(done, "VORTOS_PROCESS_ENV_ALLOW=", "'LD_PRELOAD' can never be allowed")
    assert not db.exists()
