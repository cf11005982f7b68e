"""The idempotency recipe (FireContext's docstring) under the kill it exists for: a real
consumer process SIGKILLed after the command committed its effect and before the run's
settlement was written. The fire runs again, with the same key, and the effect happens once.

The window between "the command returned" and "the settlement committed" is held open for
sure: the test takes the database's write lock before letting the command return, so the
consumer cannot settle, and kills it then.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from engine import (
    Engine,
    IntervalTrigger,
    RunState,
    ScheduleSpec,
    builtin_commands,
    load_app,
    open_engine,
)
from engine.commands import FireContext
from engine.commands.process import ProcessAllowlist
from engine.domain.timeutil import SECOND_MS
from engine.ports import RunQuery
from tests.conftest import cli_env
from tests.integration.processes import wait_for

APP = '''
"""A billing command following the recipe: the key and the effect in one transaction."""

import os
import sqlite3
import time

from engine import FireContext, schedulable

EFFECTS = os.environ["VORTOS_TEST_EFFECTS"]
JOURNAL = os.environ["VORTOS_TEST_JOURNAL"]
GO = os.environ["VORTOS_TEST_GO"]


def note(text: str) -> None:
    fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\\n").encode())
    finally:
        os.close(fd)


@schedulable("bill")
def bill(*, fire: FireContext) -> str:
    db = sqlite3.connect(EFFECTS, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        inserted = db.execute(
            "INSERT INTO processed (key) VALUES (?) ON CONFLICT DO NOTHING",
            (fire.idempotency_key,),
        ).rowcount
        if inserted:
            db.execute("UPDATE account SET balance = balance + 100")
        db.execute("COMMIT")
    finally:
        db.close()
    note(f"executed {fire.attempt} {fire.idempotency_key} effect={inserted}")
    if fire.attempt == 1:
        while not os.path.exists(GO):  # the test holds the settle back first
            time.sleep(0.01)
    note(f"returning {fire.attempt}")
    return "billed" if inserted else "already billed"
'''
WAIT_S = 60.0


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "billing_app.py").write_text(textwrap.dedent(APP))
    effects = tmp_path / "effects.db"
    db = sqlite3.connect(effects)
    db.executescript(
        "CREATE TABLE processed (key TEXT PRIMARY KEY);"
        "CREATE TABLE account (balance INTEGER NOT NULL); INSERT INTO account VALUES (0);"
    )
    db.close()
    return {
        "app": folder,
        "effects": effects,
        "journal": tmp_path / "journal.txt",
        "go": tmp_path / "go",
    }


@pytest.fixture
def engine(db_path: Path, files: dict[str, Path]) -> Iterator[Engine]:
    sys.path.insert(0, str(files["app"]))
    env = {
        "VORTOS_TEST_EFFECTS": str(files["effects"]),
        "VORTOS_TEST_JOURNAL": str(files["journal"]),
        "VORTOS_TEST_GO": str(files["go"]),
    }
    os.environ.update(env)
    try:
        app = load_app("billing_app")
        with open_engine(db_path, commands=app.register_into(builtin_commands())) as opened:
            yield opened
    finally:
        sys.path.remove(str(files["app"]))
        sys.modules.pop("billing_app", None)
        for name in env:
            os.environ.pop(name, None)


def _consumer(db: Path, files: dict[str, Path], name: str) -> subprocess.Popen[bytes]:
    env = cli_env(
        {
            "VORTOS_TEST_EFFECTS": str(files["effects"]),
            "VORTOS_TEST_JOURNAL": str(files["journal"]),
            "VORTOS_TEST_GO": str(files["go"]),
            "PYTHONPATH": os.pathsep.join([str(files["app"]), os.getcwd()]),
        }
    )
    log = (files["app"].parent / f"{name}.log").open("w")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vortos_tui.cli",
            "--db",
            str(db),
            "--app",
            "billing_app",
            "consume",
            "--node-id",
            name,
            "--claim-ttl",
            "1s",
        ],
        cwd=files["app"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def _journal(files: dict[str, Path]) -> list[str]:
    path = files["journal"]
    return path.read_text().splitlines() if path.exists() else []


def test_a_command_killed_between_its_return_and_its_settle_runs_again_with_the_same_key_and_its_effect_happens_once(  # noqa: E501
    engine: Engine, db_path: Path, files: dict[str, Path]
) -> None:
    engine.service.create(
        ScheduleSpec(name="billing", trigger=IntervalTrigger(3600 * SECOND_MS, 0), command="bill"),
        actor="test",
    )
    engine.service.pause("billing", actor="test")
    run = engine.service.trigger("billing", actor="test")
    doomed = _consumer(db_path, files, "doomed")
    lock = apsw.Connection(str(db_path))
    try:
        wait_for(
            lambda: any(line.startswith("executed 1 ") for line in _journal(files)),
            timeout=WAIT_S,
            what="the first execution to commit its effect",
        )
        # The consumer's settle cannot commit while this holds the write lock.
        lock.execute("BEGIN IMMEDIATE")
        files["go"].touch()
        wait_for(
            lambda: "returning 1" in _journal(files), timeout=WAIT_S, what="the command to return"
        )
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(30)
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(30)
    (unsettled,) = engine.service.runs(RunQuery())
    assert unsettled.state is RunState.RUNNING  # its command ran; its settle never committed
    survivor = _consumer(db_path, files, "survivor")
    try:
        wait_for(
            lambda: engine.service.runs(RunQuery())[0].state is RunState.COMPLETED,
            timeout=WAIT_S,
            what="the fire to run again and complete",
        )
    finally:
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(30) == 0
    (done,) = engine.service.runs(RunQuery())
    assert done.id == run.id
    assert (done.attempts, done.abandoned, done.output) == (2, 1, "already billed")
    executed = [line for line in _journal(files) if line.startswith("executed")]
    assert executed == [
        f"executed 1 {run.slot_key} effect=1",
        f"executed 2 {run.slot_key} effect=0",  # the same key: the effect is not repeated
    ]
    effects = sqlite3.connect(files["effects"])
    try:
        assert effects.execute("SELECT balance FROM account").fetchone() == (100,)
        assert effects.execute("SELECT key FROM processed").fetchall() == [(run.slot_key,)]
    finally:
        effects.close()


def test_a_process_command_gets_the_key_as_vortos_idempotency_key() -> None:
    from engine.commands.process import ProcessRunner  # noqa: PLC0415
    from engine.domain.run import RunKind  # noqa: PLC0415

    printenv = "/usr/bin/printenv"
    if not os.access(printenv, os.X_OK):
        pytest.skip("needs coreutils' printenv")
    runner = ProcessRunner(ProcessAllowlist.of([printenv]))
    fire = FireContext(
        run_id=7,
        tenant="default",
        schedule_id="s-1",
        schedule_name="nightly",
        slot_key="s-1@2026-01-05T00:00:00+00:00",
        slot_at=0,
        kind=RunKind.SCHEDULED,
        attempt=2,
    )
    result = runner([printenv, "VORTOS_IDEMPOTENCY_KEY"], fire=fire)
    assert result.output is not None
    assert fire.idempotency_key == fire.slot_key
    assert fire.slot_key in result.output
