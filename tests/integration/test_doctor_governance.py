"""`vortos doctor`'s governance checks: the audit key, the audit chains, the operators. A
missing key is a failure (and a clear error for every change), never a silent disable."""

from __future__ import annotations

import json
import os
import pwd
import shutil
from pathlib import Path

import apsw
import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.domain.access import Grant, Role
from engine.domain.timeutil import MINUTE_MS
from engine.governance.doctor import (
    DoctorContext,
    Finding,
    Status,
    run_checks,
)
from tests.conftest import T0, run_cli

ME = pwd.getpwuid(os.getuid()).pw_name


def seeded(tmp_path: Path, *, operators: bool = True) -> Path:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="setup"
        )
        if operators:  # this account (the CLI's) and setup govern it
            for who in ("setup", ME):
                engine.storage.operators.grant(Grant(who, Role.ADMIN), by="setup", at=T0)
    return db


def findings(result_stdout: str) -> dict[str, dict[str, str]]:
    report = json.loads(result_stdout)
    assert report["schema_version"] == 1
    for finding in report["findings"]:
        assert set(finding) == {"check_id", "status", "summary", "detail", "remediation"}
    return {f["check_id"]: f for f in report["findings"]}


def verified_marks(db: Path) -> list[tuple[object, ...]]:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return list(conn.execute("SELECT * FROM audit_verified ORDER BY chain"))
    finally:
        conn.close()


def test_a_healthy_database_is_clear_and_the_doctor_changes_nothing(tmp_path: Path) -> None:
    db = seeded(tmp_path)
    before = verified_marks(db)
    result = run_cli("doctor", "--json", db=db)
    found = findings(result.stdout)
    # (No `vortos run` serves this database, so the scheduler's own checks fail: see
    # test_doctor.py; these are the governance checks.)
    assert found["audit.key"]["status"] == "pass"
    assert found["audit.chain"]["status"] == "pass"
    assert "verified up to their heads" in found["audit.chain"]["summary"]
    assert found["governance.operators"]["status"] == "pass"
    assert verified_marks(db) == before  # verification is not recorded by the doctor
    table = run_cli("doctor", db=db)
    assert "audit.chain" in table.stdout


def test_a_missing_key_fails_the_doctor_and_every_change_says_why(tmp_path: Path) -> None:
    db = seeded(tmp_path)
    key = Path(f"{db}.audit-key")
    key.rename(tmp_path / "elsewhere")
    result = run_cli("doctor", "--json", db=db)
    assert result.code == 1
    found = findings(result.stdout)
    assert found["audit.key"]["status"] == "fail"
    assert "restore the key file" in found["audit.key"]["remediation"]
    assert found["audit.chain"]["status"] == "skip"
    assert "audit.key" in result.stderr
    change = run_cli("schedule", "pause", "report", db=db)
    assert change.code == 1
    assert "audit key file" in change.stderr
    assert "Traceback" not in change.stderr
    assert not key.exists()  # no new key was made for a chain that has entries


def test_a_wrong_key_fails_the_chain_check_and_verify_cleanly(tmp_path: Path) -> None:
    db = seeded(tmp_path)
    (tmp_path / "other").mkdir()
    other = seeded(tmp_path / "other")
    shutil.copy(f"{other}.audit-key", f"{db}.audit-key")
    result = run_cli("doctor", "--json", db=db)
    assert result.code == 1
    found = findings(result.stdout)
    assert found["audit.key"]["status"] == "pass"  # a key is there ...
    assert found["audit.chain"]["status"] == "fail"  # ... but not the one that signed
    assert "broken at entry 1" in found["audit.chain"]["summary"]
    verified = run_cli("audit", "verify", db=db)
    assert verified.code == 1
    assert "broken at entry 1" in verified.stderr
    assert "Traceback" not in verified.stderr


def test_a_database_nobody_governs_is_a_warning(tmp_path: Path) -> None:
    db = seeded(tmp_path, operators=False)
    result = run_cli("doctor", "--json", db=db)
    assert findings(result.stdout)["governance.operators"]["status"] == "warn"


def test_a_check_that_crashes_is_its_own_failure_and_the_others_still_run(
    tmp_path: Path,
) -> None:
    class Broken:
        check_id = "broken.check"

        def run(self, ctx: DoctorContext) -> Finding:
            raise RuntimeError("boom")

    class Fine:
        check_id = "fine.check"

        def run(self, ctx: DoctorContext) -> Finding:
            return Finding(self.check_id, Status.PASS, "fine")

    db = seeded(tmp_path)
    with open_engine(db, create=False, readonly=True) as engine:
        report = run_checks(DoctorContext(engine.storage, engine.clock, db), [Broken(), Fine()])
    assert [(f.check_id, f.status) for f in report.findings] == [
        ("broken.check", Status.FAIL),
        ("fine.check", Status.PASS),
    ]
    assert "RuntimeError: boom" in report.findings[0].detail
    assert not report.clear


def test_a_missing_database_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli("doctor", db=tmp_path / "absent.db")
    assert result.code == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["--json", "extra"], ["--bogus"]])
def test_bad_arguments_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    assert run_cli("doctor", *args, db=seeded(tmp_path)).code == 2
