"""An auditor verifies with the public key alone (issue 16, acceptance 4), checked from
outside: the owner writes `vortos audit public-key -o` and `vortos audit export -o`; another
Unix account, which can read neither the database nor its key file, verifies the export with
`--public-key` and is told intact; an export edited and re-hashed without the key is broken,
and one whose signed heads were stripped cannot be verified (UNVERIFIED, exit 1), which is not
the same as broken."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.domain.audit import content_hash
from engine.governance.keys import default_key_file
from tests.conftest import T0, CliResult, run_cli
from tests.integration.test_audit_tamper import dispatch
from tests.security.deployment import accounts, needs_root

ROOT = Path(__file__).resolve().parents[2]

pytestmark = needs_root


@dataclass(frozen=True)
class Handed:
    """What the owner hands the auditor, in a directory the auditor may read."""

    auditor: str
    db: Path  # the owner's, out of the auditor's reach
    public_key: Path
    export: Path


@pytest.fixture
def handed(tmp_path: Path) -> Iterator[Handed]:
    db = tmp_path / "private" / "vortos.db"
    db.parent.mkdir(mode=0o700)
    dispatch(db, T0)
    shared = Path(tempfile.mkdtemp(prefix="vt-auditor-", dir="/tmp"))
    try:
        shared.chmod(0o755)
        public, exported = shared / "pub.json", shared / "export.jsonl"
        wrote = run_cli("audit", "public-key", "-o", str(public), db=db)
        assert wrote.code == 0, wrote.stderr
        wrote = run_cli("audit", "export", "-o", str(exported), db=db)
        assert wrote.code == 0, wrote.stderr
        for handed_file in (public, exported):
            handed_file.chmod(0o644)  # the auditor's to read; nothing secret in either
        with accounts() as made:
            yield Handed(made.outsider, db, public, exported)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def as_auditor(handed: Handed, *args: str) -> CliResult:
    """`vortos --db DB ARGS` as the auditor's account (tests/integration/as_account.py)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.as_account",
            handed.auditor,
            "--",
            "--db",
            str(handed.db),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", ""), "COLUMNS": "200"},
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


def verify_export(handed: Handed, export: Path | None = None) -> CliResult:
    return as_auditor(
        handed,
        "audit",
        "verify",
        "--file",
        str(export or handed.export),
        "--public-key",
        str(handed.public_key),
    )


def lines_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_lines(path: Path, values: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(v, sort_keys=True) + "\n" for v in values))
    path.chmod(0o644)


def test_the_auditor_holds_no_secret_and_cannot_read_the_database(handed: Handed) -> None:
    """The premise: the key file and the database are out of the auditor's reach."""
    key = default_key_file(handed.db)
    assert key.exists()
    for secret in (key, handed.db):
        assert secret.stat().st_mode & 0o077 == 0 or secret.parent.stat().st_mode & 0o077 == 0
    assert "secret" not in handed.public_key.read_text().lower()
    said = as_auditor(handed, "audit", "verify")
    assert said.code != 0, said.stdout + said.stderr
    assert "Traceback" not in said.stderr


def test_an_export_verifies_with_the_public_key_as_another_account(handed: Handed) -> None:
    result = verify_export(handed)
    assert result.code == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "tenant:default" in result.stdout
    assert "BROKEN" not in result.stdout
    assert "UNVERIFIED" not in result.stdout
    assert "intact" in result.stdout


def test_an_export_edited_and_rehashed_without_the_key_is_broken(handed: Handed) -> None:
    """One entry's actor changed; its hash and every later entry's (and the chain's head line)
    recomputed, as anyone can: only the key could sign them again."""
    values = lines_of(handed.export)
    target = next(
        i
        for i, v in enumerate(values)
        if v.get("chain") == "tenant:default" and v.get("event") == "fires.dispatched"
    )
    edited_seq = int(str(values[target]["seq"]))
    prev: str | None = None
    for value in values[target:]:
        if "head" in value:
            head = value["head"]
            assert isinstance(head, dict)
            if head["chain"] == "tenant:default" and prev is not None:
                head["hash"] = prev
            continue
        if value.get("chain") != "tenant:default":
            continue
        if int(str(value["seq"])) == edited_seq:
            value["actor"] = "mallory"
        if prev is not None:
            value["prev_hash"] = prev
        data = value["data"]
        assert isinstance(data, dict)
        value["hash"] = content_hash(
            chain=str(value["chain"]),
            seq=int(str(value["seq"])),
            event=str(value["event"]),
            actor=str(value["actor"]),
            tenant=None if value["tenant"] is None else str(value["tenant"]),
            schedule_id=None if value["schedule_id"] is None else str(value["schedule_id"]),
            slot_key=None if value["slot_key"] is None else str(value["slot_key"]),
            at=int(str(value["at"])),
            data=data,
            prev_hash=str(value["prev_hash"]),
        )
        prev = str(value["hash"])
    edited = handed.export.with_name("edited.jsonl")
    write_lines(edited, values)
    assert edited.read_bytes() != handed.export.read_bytes()
    result = verify_export(handed, edited)
    assert result.code == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "audit chain tenant:default is broken at entry" in result.stderr, result.stderr
    assert "BROKEN" in result.stdout


def test_an_export_without_its_signed_heads_cannot_be_verified_and_is_not_called_broken(
    handed: Handed,
) -> None:
    values = [v for v in lines_of(handed.export) if "head" not in v]
    stripped = handed.export.with_name("stripped.jsonl")
    write_lines(stripped, values)
    result = verify_export(handed, stripped)
    assert result.code == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "cannot be verified from entry" in result.stderr, result.stderr
    assert "is broken at" not in result.stderr
    assert "UNVERIFIED" in result.stdout
    assert "BROKEN" not in result.stdout
