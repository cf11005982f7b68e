"""The audit key's life on real files and processes: one key per database (concurrent
`db init`, a node with another key), epochs sealed one way (the old secret gone from the key
file), rotations recorded in the chain and taken up by a running `vortos run` without a
restart, a rotation interrupted between the key file and the database."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.domain.audit import EPOCH_SEALED, KEY_ROTATED, tenant_chain
from engine.domain.audit_keys import EpochKey, KeyKind
from engine.domain.errors import AuditKeyMismatch
from engine.domain.timeutil import MINUTE_MS
from engine.governance.audit import verify
from engine.governance.keys import begin_rotation, default_key_file, load_keyring
from tests.conftest import T0, cli_env, run_cli
from tests.integration.processes import Daemon, wait_for

CHAIN = tenant_chain("default")


def fresh_key() -> str:
    return secrets.token_hex(32)


def fingerprints(text: str) -> list[str]:
    return re.findall(r"\b[0-9a-f]{16}\b", text)


def test_three_concurrent_db_inits_with_three_keys_end_with_one(tmp_path: Path) -> None:
    db = tmp_path / "race.db"
    keys = [fresh_key() for _ in range(3)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "vortos_tui.cli", "--db", str(db), "db", "init"],
            env=cli_env({"VORTOS_AUDIT_KEY": key}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for key in keys
    ]
    results = [(p.wait(60), *p.communicate()) for p in processes]
    winners = [r for r in results if r[0] == 0]
    losers = [r for r in results if r[0] != 0]
    assert len(winners) == 1, results
    assert {r[0] for r in losers} == {2}, results
    recorded = re.search(r"audit key ([0-9a-f]{16})", winners[0][1] + winners[0][2])
    assert recorded is not None
    for _, _, err in losers:
        named = fingerprints(err)
        assert recorded.group(1) in named  # the database's key ...
        assert len(set(named)) == 2  # ... and this node's own
        assert "Traceback" not in err
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert conn.execute("SELECT count(*) FROM audit_keys").fetchall() == [(1,)]
    finally:
        conn.close()


def test_a_node_with_another_key_exits_2_naming_both_keys(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    assert run_cli("db", "init", db=db).code == 0
    ours = load_keyring(db, create=False).active_id
    daemon = Daemon(db, "intruder", tmp_path, env={"VORTOS_AUDIT_KEY": fresh_key()})
    assert daemon.process.wait(60) == 2, daemon.log
    assert ours in daemon.log
    assert len(set(fingerprints(daemon.log))) >= 2
    assert "Traceback" not in daemon.log


def test_sealing_an_epoch_erases_its_key_from_the_key_file(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    assert run_cli("db", "init", db=db).code == 0
    key_file = default_key_file(db)
    before = load_keyring(db, create=False)
    sealed_secret = before.current.secret.decode()
    assert run_cli("audit", "seal", db=db).code == 0
    text = key_file.read_text()
    assert sealed_secret not in text
    after = load_keyring(db, create=False)
    assert after.epoch == 1
    assert after.current == before.current.evolved()
    assert (key_file.stat().st_mode & 0o777) == 0o600
    assert run_cli("audit", "verify", "--full", db=db).code == 0


def test_a_second_process_catches_up_with_a_sealed_epoch_by_itself(tmp_path: Path) -> None:
    """A node that still holds the sealed epoch's key derives the next one when it next
    writes, signs with it, and erases the old one from its own key file."""
    db = tmp_path / "vortos.db"
    node_file = tmp_path / "node.key"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="alice"
        )
    node_file.write_text(default_key_file(db).read_text())
    node_file.chmod(0o600)
    old_secret = load_keyring(db, key_file=node_file, create=False).current.secret.decode()
    assert run_cli("audit", "seal", db=db).code == 0
    with open_engine(db, clock=clock, audit_key_file=node_file) as node:
        node.service.pause("report", actor="bob")
        newest = node.storage.audit.latest(CHAIN, limit=1)[0]
        assert newest.key_id == load_keyring(db, create=False).active_id
    assert old_secret not in node_file.read_text()
    keys = load_keyring(db, create=False)
    with open_engine(db, readonly=True) as reader:
        assert verify(reader.storage.audit, keys, full=True, record=False).intact


def test_a_rotation_reaches_a_running_service_without_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    assert run_cli("db", "init", db=db).code == 0
    assert run_cli("schedule", "add", "tick", "--every", "1s", "--command", "noop", db=db).code == 0
    daemon = Daemon(db, "node-a", tmp_path)
    try:

        def batches_signed_by(key_id: str) -> int:
            conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
            try:
                found = conn.execute(
                    "SELECT count(*) FROM audit_entries WHERE event = 'fires.dispatched' "
                    "AND key_id = ?",
                    (key_id,),
                ).fetchall()[0][0]
                assert isinstance(found, int)
                return found
            finally:
                conn.close()

        old = load_keyring(db, create=False).active_id
        wait_for(lambda: batches_signed_by(old) > 0, 60, "a fire signed with the first key")
        rotated = run_cli("audit", "rotate-key", db=db)
        assert rotated.code == 0, rotated.stderr
        new = load_keyring(db, create=False).active_id
        assert new != old
        wait_for(lambda: batches_signed_by(new) > 0, 60, "a fire signed with the rotated key")
        assert daemon.process.poll() is None  # the same process, not restarted
    finally:
        assert daemon.terminate() == 0, daemon.log
    result = run_cli("audit", "verify", "--full", db=db)
    assert result.code == 0, result.stdout + result.stderr
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        # Nothing the old key signed comes after the rotation entry of its chain.
        rows = conn.execute(
            "SELECT chain, seq FROM audit_entries WHERE event = ?", (KEY_ROTATED,)
        ).fetchall()
        assert rows
        for chain, seq in rows:
            later_old = conn.execute(
                "SELECT count(*) FROM audit_entries WHERE chain = ? AND seq > ? AND key_id = ?",
                (chain, seq, old),
            ).fetchall()[0][0]
            assert later_old == 0
    finally:
        conn.close()


def test_a_node_without_the_rotated_key_refuses_to_sign_and_says_what_to_do(
    tmp_path: Path,
) -> None:
    db = tmp_path / "vortos.db"
    other_host = tmp_path / "other-host.key"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="alice"
        )
    other_host.write_text(default_key_file(db).read_text())
    other_host.chmod(0o600)
    assert run_cli("audit", "rotate-key", db=db).code == 0
    with open_engine(db, clock=clock, audit_key_file=other_host) as node:
        with pytest.raises(AuditKeyMismatch, match="retired") as refused:
            node.service.pause("report", actor="bob")
        assert "Copy the key file" in str(refused.value)
        assert node.service.get("report").status.value == "active"  # nothing changed


def test_a_rotation_interrupted_after_the_key_file_is_finished_at_the_next_write(
    tmp_path: Path,
) -> None:
    """`rotate-key` writes the new key into the file first (as the rotation under way), then
    records it in the database: a crash between the two loses nothing, and a rotation the
    database did record is taken from the file's pending line."""
    db = tmp_path / "vortos.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="alice"
        )
        ring = engine.storage.audit.keys()
        path = default_key_file(db)
        pending = begin_rotation(path, ring)
        # Crash before the database recorded it: the old key still signs.
        engine.service.pause("report", actor="bob")
        assert engine.storage.audit.latest(CHAIN, limit=1)[0].key_id == ring.active_id
    # The database records the rotation; this process dies before rewriting the file.
    with open_engine(db, clock=clock) as engine:
        audit = engine.storage.audit
        ring = audit.keys()
        assert ring.pending == pending
        audit.transition(KeyKind.ROTATED, pending, "operator")
    # Put the file back as the crash left it: the old key and the pending one.
    path.write_text(
        path.read_text().replace(f"epoch {pending.epoch} ", f"next {pending.epoch} ", 1)
        + f"epoch 0 {ring.current.secret.decode()}\n"
    )
    with open_engine(db, clock=clock) as engine:
        engine.service.resume("report", actor="carol")
        assert engine.storage.audit.latest(CHAIN, limit=1)[0].key_id == pending.key_id
    assert ring.current.secret.decode() not in path.read_text()
    keys = load_keyring(db, create=False)
    with open_engine(db, readonly=True) as reader:
        result = verify(reader.storage.audit, keys, full=True, record=False)
    assert result.intact, [r.problem for r in result.chains]


def test_each_chain_records_the_epoch_seal_and_the_rotation(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        for tenant in ("acme", "globex"):
            engine.service.create(
                ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop", tenant=tenant),
                actor="alice",
            )
        audit = engine.storage.audit
        audit.transition(KeyKind.EVOLVED, audit.keys().current.evolved(), "operator")
        audit.transition(
            KeyKind.ROTATED, EpochKey(2, fresh_key().encode()), "operator"
        )  # the key source is the file: rotate through it in real use
        chains = audit.chains()
        events = {c: [e.event for e in audit.entries(c)] for c in chains}
    assert set(chains) == {"tenant:acme", "tenant:globex"}
    for chain, seen in events.items():
        assert seen[0] == "audit.chain_opened", chain
        assert EPOCH_SEALED in seen
        assert KEY_ROTATED in seen


def test_the_anchor_schedule_seals_the_epoch_once_it_is_old_enough(tmp_path: Path) -> None:
    from engine.retention.audit_upkeep import seal_if_due  # noqa: PLC0415

    db = tmp_path / "vortos.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="alice"
        )
        assert seal_if_due(engine.storage, clock, 86_400_000) is None  # a day not over yet
        clock.advance(86_400)
        assert seal_if_due(engine.storage, clock, 86_400_000) == 0
        assert seal_if_due(engine.storage, clock, 86_400_000) is None  # epoch 1 just began
        engine.service.pause("report", actor="bob")
        assert engine.storage.audit.keys().epoch == 1
    assert load_keyring(db, create=False).epoch == 1


def test_verify_with_the_archive_and_anchors_needs_only_the_public_key(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="alice"
        )
        for _ in range(5):
            engine.service.trigger("report", actor="bob")
    archive = tmp_path / "archive"
    pub = tmp_path / "pub.json"
    for args in (
        ("audit", "archive", "--before", "1s", "-o", str(archive)),
        ("audit", "anchor"),
        ("audit", "public-key", "-o", str(pub)),
    ):
        done = run_cli(*args, db=db)
        assert done.code == 0, done.stderr
    anchors = db.with_name(db.name + ".anchors.jsonl")
    audited = ("--with-archive", str(archive), "--anchors", str(anchors), "--public-key", str(pub))
    # No secret anywhere: the key file is moved away.
    key = default_key_file(db)
    key.rename(tmp_path / "elsewhere.key")
    done = run_cli("audit", "verify", *audited, db=db)
    assert done.code == 0, done.stdout + done.stderr
    assert "with the public key only" in done.stderr
    entries = next(archive.glob("*tenant:default*.jsonl"))
    lines = entries.read_text().splitlines()
    lines[2] = lines[2].replace('"actor": "bob"', '"actor": "eve"')
    entries.write_text("\n".join(lines) + "\n")
    done = run_cli("audit", "verify", *audited, db=db)
    assert done.code == 1
    assert "broken at entry 3" in done.stderr
    assert "Traceback" not in done.stderr
