"""The audit chain on a real database file: tampering with the sqlite3 shell is found and the
first bad entry named; an intact chain verifies, incrementally from the last verification;
keys: missing, wrong, rotated."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.domain.audit import SYSTEM_CHAIN, AuditEvent, content_hash, tenant_chain
from engine.domain.timeutil import MINUTE_MS
from engine.governance.audit import verify
from engine.governance.keys import default_key_file, load_keyring
from tests.cli.support import db_state
from tests.conftest import T0, run_cli

CHAIN = tenant_chain("default")
TRIGGERS = 29  # the opening, the create and 29 triggers: entries 1..31 in tenant:default

needs_shell = pytest.mark.skipif(
    shutil.which("sqlite3") is None,
    reason="the sqlite3 shell is not installed (apt install sqlite3)",
)


@pytest.fixture(scope="module")
def audited_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database whose tenant:default chain holds 31 entries: its opening, a create and 29
    triggers. Built once per module; each test gets a copy."""
    db = tmp_path_factory.mktemp("audited") / "vortos.db"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="alice"
        )
        for _ in range(TRIGGERS):
            engine.service.trigger("report", actor="bob")
    return db


@pytest.fixture
def audited(audited_once: Path, tmp_path: Path) -> Path:
    for part in audited_once.parent.glob(audited_once.name + "*"):
        shutil.copy2(part, tmp_path / part.name)
    return tmp_path / audited_once.name


def shell(db: Path, sql: str) -> None:
    """What someone with write access to the file does: drop the guards, then edit."""
    guards = (
        "DROP TRIGGER IF EXISTS audit_entries_no_update; "
        "DROP TRIGGER IF EXISTS audit_entries_no_delete; "
    )
    subprocess.run(["sqlite3", str(db), guards + sql], check=True, timeout=30)


def verify_cli(db: Path, *args: str) -> tuple[int, str, str]:
    result = run_cli("audit", "verify", *args, db=db)
    return result.code, result.stdout, result.stderr


def head_of(db: Path) -> str:
    code, out, err = verify_cli(db)
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("--expect-head"))
    return line.split(" ", 1)[1]


def test_an_untouched_chain_verifies_and_prints_its_head(audited: Path) -> None:
    code, out, err = verify_cli(audited, "--full")
    assert code == 0, err
    assert f"--expect-head {CHAIN}=31:" in out


@needs_shell
@pytest.mark.parametrize(
    ("tamper", "first_bad", "says"),
    [
        (
            "UPDATE audit_entries SET actor = 'mallory' WHERE chain = 'tenant:default' AND seq = 7",
            7,
            "content does not match its hash",
        ),
        (
            'UPDATE audit_entries SET data = \'{"name":"report","run":1}\' '
            "WHERE chain = 'tenant:default' AND seq = 12",
            12,
            "content does not match its hash",
        ),
        (
            # other content, spelled with spaces and the keys out of order
            'UPDATE audit_entries SET data = \'{ "version": 1, "run": 99, "name": "report" }\' '
            "WHERE chain = 'tenant:default' AND seq = 12",
            12,
            "content does not match its hash",
        ),
        ("DELETE FROM audit_entries WHERE chain = 'tenant:default' AND seq = 9", 9, "missing"),
        (
            # swap entries 5 and 6
            "UPDATE audit_entries SET seq = -5 WHERE chain = 'tenant:default' AND seq = 5; "
            "UPDATE audit_entries SET seq = 5 WHERE chain = 'tenant:default' AND seq = 6; "
            "UPDATE audit_entries SET seq = 6 WHERE chain = 'tenant:default' AND seq = -5;",
            5,
            "previous hash",
        ),
        (
            # a forged entry squeezed in at 15: the rest moved up one
            "UPDATE audit_entries SET seq = seq + 1000 "
            "WHERE chain = 'tenant:default' AND seq >= 15; "
            "UPDATE audit_entries SET seq = seq - 999 "
            "WHERE chain = 'tenant:default' AND seq >= 1015; "
            "INSERT INTO audit_entries SELECT chain, 15, 'schedule.deleted', 'mallory', tenant, "
            "schedule_id, NULL, at, '{}', prev_hash, hash, key_id, signature, seal "
            "FROM audit_entries WHERE chain = 'tenant:default' AND seq = 16;",
            15,
            "content does not match its hash",
        ),
    ],
    ids=[
        "edited actor",
        "edited data",
        "edited and respelled data",
        "deleted",
        "swapped",
        "inserted",
    ],
)
def test_tampering_is_found_at_the_first_bad_entry(
    audited: Path, tamper: str, first_bad: int, says: str
) -> None:
    shell(audited, tamper)
    code, out, err = verify_cli(audited, "--full")
    assert code == 1, out + err
    assert f"audit chain {CHAIN} is broken at entry {first_bad}:" in err
    assert says in err
    assert "Traceback" not in err


@needs_shell
def test_data_respelled_with_the_same_content_verifies_as_the_hash_covers_content(
    audited: Path,
) -> None:
    """The hash is of the canonical JSON of the content: the walk hashes the stored text as it
    is when that is the text sealed, and decodes and re-encodes it otherwise, so spaces and key
    order alone are no change (as before the shortcut), and other content is (above)."""
    with open_engine(audited, readonly=True) as engine:
        stored = engine.storage.audit.entries(CHAIN, after_seq=11, limit=1)[0]
    assert stored.data_json == '{"name":"report","run":10,"version":1}'
    respelled = json.dumps(dict(reversed(list(stored.data.items()))), indent=1)
    assert respelled != stored.data_json
    shell(
        audited,
        f"UPDATE audit_entries SET data = '{respelled}' "
        "WHERE chain = 'tenant:default' AND seq = 12",
    )
    code, out, err = verify_cli(audited, "--full")
    assert code == 0, out + err
    with open_engine(audited, readonly=True) as engine:
        after = engine.storage.audit.entries(CHAIN, after_seq=11, limit=1)[0]
    assert (after.data_json, after.data) == (respelled, stored.data)


@needs_shell
def test_a_forged_entry_appended_with_a_made_up_signature_is_found(audited: Path) -> None:
    with open_engine(audited, readonly=True) as engine:
        head = engine.storage.audit.head(CHAIN)
    forged_hash = content_hash(
        chain=CHAIN,
        seq=32,
        event="schedule.deleted",
        actor="mallory",
        tenant="default",
        schedule_id=None,
        slot_key=None,
        at=T0,
        data={},
        prev_hash=head.hash,
    )
    shell(
        audited,
        "INSERT INTO audit_entries VALUES ('tenant:default', 32, 'schedule.deleted', 'mallory', "
        f"'default', NULL, NULL, {T0}, '{{}}', '{head.hash}', '{forged_hash}', 'k', "
        f"'{'0' * 64}', NULL);",
    )
    code, _, err = verify_cli(audited, "--full")
    assert code == 1
    assert "broken at entry 32" in err
    assert "signed with key k, but the chain is signed with" in err


@needs_shell
def test_a_truncated_tail_is_found_by_the_last_verification_and_by_an_expected_head(
    audited: Path,
) -> None:
    expected = head_of(audited)  # verifies, and remembers the head (31)
    shell(audited, "DELETE FROM audit_entries WHERE chain = 'tenant:default' AND seq > 27")
    code, _, err = verify_cli(audited)
    assert code == 1
    assert "broken at entry 28" in err
    assert "truncated" in err
    # Even with the verification record gone too, the head kept outside catches it.
    shell(audited, "DELETE FROM audit_verified")
    code, _, err = verify_cli(audited, "--full", "--expect-head", expected)
    assert code == 1
    assert "broken at entry 28" in err
    assert "truncated" in err


def test_verification_resumes_from_the_last_one_and_reads_only_new_entries(
    tmp_path: Path,
) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        log = engine.storage.audit
        for start in range(0, 100_000, 10_000):
            log.append(
                [
                    AuditEvent("test.event", actor="bench", tenant="big", data={"i": i})
                    for i in range(start, start + 10_000)
                ]
            )
        keys = load_keyring(db, create=False)
        first = verify(log, keys, chains=["tenant:big"])
        assert first.intact
        assert first.chains[0].checked == 100_001  # with the chain's opening
        assert first.chains[0].head.seq == 100_001
        log.append([AuditEvent("test.event", actor="bench", tenant="big") for _ in range(10)])
        again = verify(log, keys, chains=["tenant:big"])
        assert again.intact
        assert (again.chains[0].resumed_from, again.chains[0].checked) == (100_001, 10)
        full = verify(log, keys, chains=["tenant:big"], full=True)
        assert full.chains[0].checked == 100_011
        assert len(log.checkpoints("tenant:big")) == 100  # one per 1,000 entries


def test_export_verifies_offline_and_an_edited_export_does_not(audited: Path) -> None:
    exported = audited.with_name("audit.jsonl")
    assert run_cli("audit", "export", "--output", str(exported), db=audited).code == 0
    code, _, err = verify_cli(audited, "--file", str(exported))
    assert code == 0, err
    lines = exported.read_text().splitlines()
    # Line 1 is the database's key lineage; entry 4 of the first chain is line 5.
    assert '"vortos_audit_export"' in lines[0]
    lines[4] = lines[4].replace('"actor": "bob"', '"actor": "eve"')
    exported.write_text("\n".join(lines) + "\n")
    code, _, err = verify_cli(audited, "--file", str(exported))
    assert code == 1
    assert "broken at entry 4" in err


def test_a_missing_key_refuses_changes_and_changes_nothing(audited: Path) -> None:
    key = default_key_file(audited)
    key.rename(audited.with_name("elsewhere"))
    before = db_state(audited)
    result = run_cli("schedule", "pause", "report", db=audited)
    assert result.code == 1
    assert f"the audit key file {key} does not exist" in result.stderr
    assert "restore it" in result.stderr
    assert db_state(audited) == before
    assert not key.exists()  # a chain with entries never gets a new key silently
    code, _, err = verify_cli(audited)
    assert code == 1
    assert "does not exist" in err


def test_the_wrong_key_fails_verification_cleanly(audited: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.key"
    other.write_text("x" * 64 + "\n")
    result = run_cli(
        "audit", "verify", "--full", db=audited, env={"VORTOS_AUDIT_KEY_FILE": str(other)}
    )
    assert result.code == 1
    assert "broken at entry 1" in result.stderr
    # The key's root is not the database's: named as such, not as tampering of an entry.
    assert "not the one trusted" in result.stderr
    assert "Traceback" not in result.stderr


def test_after_a_key_rotation_old_and_new_entries_verify(audited: Path) -> None:
    result = run_cli("audit", "rotate-key", db=audited)
    assert result.code == 0, result.stderr
    with open_engine(audited, clock=ManualClock(T0 + MINUTE_MS)) as engine:
        engine.service.trigger("report", actor="carol")
        newest = engine.storage.audit.latest(CHAIN, limit=2)
    assert newest[0].key_id != newest[1].key_id  # signed with the new key
    code, _, err = verify_cli(audited, "--full")
    assert code == 0, err


def test_every_change_and_lease_change_is_in_a_chain(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec("tick", IntervalTrigger(MINUTE_MS, T0 + MINUTE_MS), "noop"), actor="a"
        )
        engine.service.pause("tick", actor="b", note="why not")
        engine.service.resume("tick", actor="c")
        daemon = engine.daemon(node_id="node-1", lease_ttl_ms=600_000)
        daemon.step()
        clock.advance(60)
        daemon.step()
        daemon.release()
        engine.service.delete("tick", actor="d")
        events = [
            (e.event, e.actor) for e in reversed(engine.storage.audit.latest(CHAIN, limit=99))
        ]
        system = [e.event for e in reversed(engine.storage.audit.latest(SYSTEM_CHAIN, limit=9))]
    assert events == [
        ("audit.chain_opened", "a"),
        ("schedule.created", "a"),
        ("schedule.paused", "b"),
        ("schedule.resumed", "c"),
        ("fires.dispatched", "node-1"),
        ("schedule.deleted", "d"),
    ]
    assert system == ["audit.chain_opened", "leader.acquired", "leader.released"]
