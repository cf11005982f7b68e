"""What issue 16 promises of the audit chain at scale, checked from outside: a real database
file dispatched by the real daemon, tampered with through the sqlite3 shell as someone with
write access to the file would (guards dropped first), verified by the real CLI in a
subprocess. Each kind of tampering exits 1 and names the entry and what broke, never with a
traceback; a real retention sweep is not taken for tampering; a key stolen after an epoch was
sealed cannot forge that epoch, nor can a retired key sign after its rotation, nor a chain
from another database with the same key pass as this one's.

Written from the issue's promises (acceptance 2 and 3), not from the code. Three promises did
not hold when this was written (a truncation named as added runs, a prune excusing every id of
its span, a thief's re-signed mark carrying a sealed-epoch forgery): fixed, and tested here.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.domain.audit import AuditEntry, AuditEvent, content_hash, entry_message, seal
from engine.domain.schedule import OverlapPolicy
from engine.domain.timeutil import DAY_MS, MINUTE_MS
from engine.governance.keys import default_key_file, load_keyring
from engine.testing.conformance.fire_builders import claim, complete
from tests.conftest import T0, CliResult, run_cli

CHAIN = "tenant:default"
SCHEDULES = ("alpha", "beta", "gamma")
# The chain of `dispatched`: 1 its opening, 2-4 the creates, 5-7 three dispatch batches of
# three runs each (runs 1-3, 4-6, 7-9), all of epoch 0.
FIRST_BATCH, MIDDLE_BATCH, LAST_BATCH = 5, 6, 7
HEAD = 7

pytestmark = pytest.mark.skipif(
    shutil.which("sqlite3") is None,
    reason="the sqlite3 shell is not installed (apt install sqlite3): it does the tampering",
)


# -- the database, and what a tamperer does to it ---------------------------------------------


def dispatch(
    db: Path, start: int, *, batches: int = 3, overlap: OverlapPolicy = OverlapPolicy.SKIP
) -> None:
    """Three schedules every minute, and `batches` dispatch transactions by the real daemon
    (one a minute, no lookahead: each transaction fires one slot of each schedule)."""
    clock = ManualClock(start)
    with open_engine(db, clock=clock) as engine:
        for name in SCHEDULES:
            trigger = IntervalTrigger(MINUTE_MS, start + MINUTE_MS)
            spec = ScheduleSpec(name, trigger, "noop", overlap=overlap)
            engine.service.create(spec, actor="alice")
        daemon = engine.daemon(node_id="node-1", lease_ttl_ms=3_600_000, lookahead_ms=0)
        daemon.step()  # takes the lease
        for _ in range(batches):
            clock.advance(60)
            daemon.step()


def copy_database(source: Path, directory: Path) -> Path:
    """The database file, its WAL and its key file, copied into `directory` (modes kept)."""
    for part in source.parent.glob(source.name + "*"):
        shutil.copy2(part, directory / part.name)
    return directory / source.name


@pytest.fixture(scope="module")
def dispatched_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once per module: each test tampers with a copy of its own."""
    db = tmp_path_factory.mktemp("dispatched") / "vortos.db"
    dispatch(db, T0)
    assert query(db, "SELECT count(*) FROM runs") == [(9,)]
    assert query(db, f"SELECT max(seq) FROM audit_entries WHERE chain = '{CHAIN}'") == [(HEAD,)]
    return db


@pytest.fixture
def dispatched(dispatched_once: Path, tmp_path: Path) -> Path:
    return copy_database(dispatched_once, tmp_path)


def shell(db: Path, sql: str) -> None:
    """Someone with write access to the file, in the sqlite3 shell: the guards go first."""
    guards = (
        "DROP TRIGGER IF EXISTS audit_entries_no_update; "
        "DROP TRIGGER IF EXISTS audit_entries_no_delete; "
    )
    subprocess.run(["sqlite3", str(db), guards + sql], check=True, timeout=30, capture_output=True)


def query(db: Path, sql: str) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return list(conn.execute(sql))


def literal(value: object) -> str:
    """`value` as an SQL literal for the shell."""
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def entries_of(db: Path, chain: str = CHAIN) -> list[AuditEntry]:
    rows = query(
        db,
        "SELECT chain, seq, event, actor, tenant, schedule_id, slot_key, at, data, prev_hash, "
        f"hash, key_id, signature, seal FROM audit_entries WHERE chain = {literal(chain)} "
        "ORDER BY seq",
    )
    return [
        AuditEntry(
            chain=str(r[0]),
            seq=int(str(r[1])),
            event=str(r[2]),
            actor=str(r[3]),
            tenant=None if r[4] is None else str(r[4]),
            schedule_id=None if r[5] is None else str(r[5]),
            slot_key=None if r[6] is None else str(r[6]),
            at=int(str(r[7])),
            data=json.loads(str(r[8])),
            prev_hash=str(r[9]),
            hash=str(r[10]),
            key_id=str(r[11]),
            signature=str(r[12]),
            seal=None if r[13] is None else str(r[13]),
        )
        for r in rows
    ]


def rewrite(entry: AuditEntry) -> str:
    """The UPDATE that puts `entry` in place of the stored entry at its sequence."""
    return (
        f"UPDATE audit_entries SET event = {literal(entry.event)}, actor = {literal(entry.actor)}, "
        f"data = {literal(json.dumps(dict(entry.data)))}, prev_hash = {literal(entry.prev_hash)}, "
        f"hash = {literal(entry.hash)}, key_id = {literal(entry.key_id)}, "
        f"signature = {literal(entry.signature)}, seal = {literal(entry.seal)} "
        f"WHERE chain = {literal(entry.chain)} AND seq = {entry.seq};"
    )


def verify(db: Path, *args: str, env: dict[str, str] | None = None) -> CliResult:
    return run_cli("audit", "verify", *args, db=db, env=env)


def assert_broken(result: CliResult, seq: int, *words: str) -> None:
    """Exit 1, the chain named broken at entry `seq`, with `words` in what it says."""
    said = result.stdout + result.stderr
    assert "Traceback" not in said, said
    assert result.code == 1, said
    assert f"audit chain {CHAIN} is broken at entry {seq}:" in result.stderr, said
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def head_line(result: CliResult) -> str:
    """The `--expect-head` argument an intact verify printed for the tenant chain."""
    assert result.code == 0, result.stdout + result.stderr
    for line in result.stdout.splitlines():
        if line.startswith(f"--expect-head {CHAIN}="):
            return line.split(" ", 1)[1]
    raise AssertionError(result.stdout)


def test_an_untouched_dispatch_verifies_with_its_batches_matched(dispatched: Path) -> None:
    result = verify(dispatched, "--full")
    assert result.code == 0, result.stderr
    assert "3 dispatch batch(es) matched their run rows in the ledger" in result.stderr
    # One entry per dispatch transaction, not one per fire: three batches of three.
    batches = query(
        dispatched,
        "SELECT json_extract(data, '$.count') FROM audit_entries "
        "WHERE event = 'fires.dispatched' ORDER BY seq",
    )
    assert batches == [(3,), (3,), (3,)]


# -- a run row of a past dispatch -------------------------------------------------------------


@pytest.mark.parametrize(
    ("tamper", "seq", "words"),
    [
        (
            "UPDATE runs SET slot_key = slot_key || 'x' WHERE id = 5",
            MIDDLE_BATCH,
            ("run rows of this dispatch batch were edited",),
        ),
        (
            "UPDATE runs SET schedule_id = (SELECT schedule_id FROM runs WHERE id = 4) "
            "WHERE id = 5",
            MIDDLE_BATCH,
            ("run rows of this dispatch batch were edited",),
        ),
        (
            "UPDATE runs SET slot_at = slot_at - 60000 WHERE id = 5",
            MIDDLE_BATCH,
            ("run rows of this dispatch batch were edited",),
        ),
        (
            "UPDATE runs SET due_at = due_at + 1 WHERE id = 8",
            LAST_BATCH,
            ("run rows of this dispatch batch were edited",),
        ),
        (
            "UPDATE runs SET tenant = 'other' WHERE id = 2",
            FIRST_BATCH,
            ("run 2", "tenant 'other'", "edited"),
        ),
        (
            "DELETE FROM fire_queue WHERE run_id = 5; DELETE FROM runs WHERE id = 5",
            MIDDLE_BATCH,
            ("missing from the ledger", "run 5", "deleted"),
        ),
        (
            # runs 4 and 5 trade places: each row's content under the other's id
            "UPDATE runs SET id = -4 WHERE id = 4; UPDATE runs SET id = 4 WHERE id = 5; "
            "UPDATE runs SET id = 5 WHERE id = -4",
            MIDDLE_BATCH,
            ("reordered",),
        ),
    ],
    ids=[
        "slot_key edited",
        "schedule_id edited",
        "slot_at edited",
        "due_at edited",
        "tenant edited",
        "deleted",
        "two swapped",
    ],
)
def test_a_run_row_of_a_past_dispatch_tampered_with_is_named(
    dispatched: Path, tamper: str, seq: int, words: Sequence[str]
) -> None:
    assert verify(dispatched).code == 0  # verified once: the mark is at the head
    shell(dispatched, f"PRAGMA foreign_keys = OFF; {tamper};")
    # The chain itself is untouched: --full walks the ledger against it again.
    assert_broken(verify(dispatched, "--full"), seq, *words)


def test_a_scheduled_run_no_batch_records_is_named(dispatched: Path) -> None:
    shell(
        dispatched,
        "INSERT INTO runs (id, tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, "
        "kind, state, dispatched_at, node_id) SELECT 10, tenant, schedule_id, schedule_name, "
        "schedule_id || '@2026-01-05T00:04:00+00:00', slot_at + 60000, due_at + 60000, "
        "'scheduled', 'dispatched', dispatched_at, node_id FROM runs WHERE id = 9;",
    )
    result = verify(dispatched, "--full")
    assert_broken(result, HEAD + 1, "run 10", "no dispatch entry", "added")


# -- a batch entry ----------------------------------------------------------------------------


def batch_edit(field: str, value: str) -> str:
    return (
        f"UPDATE audit_entries SET data = json_set(data, '$.{field}', json('{value}')) "
        f"WHERE chain = '{CHAIN}' AND seq = {MIDDLE_BATCH}"
    )


@pytest.mark.parametrize(
    ("tamper", "seq", "words"),
    [
        (batch_edit("count", "2"), MIDDLE_BATCH, ("content does not match its hash",)),
        (batch_edit("digest", '"' + "0" * 64 + '"'), MIDDLE_BATCH, ("content does not match",)),
        (batch_edit("runs", "[[4,2]]"), MIDDLE_BATCH, ("content does not match its hash",)),
        (
            f"DELETE FROM audit_entries WHERE chain = '{CHAIN}' AND seq = {MIDDLE_BATCH}",
            MIDDLE_BATCH,
            ("missing",),
        ),
        (
            # the first two batches trade places
            f"UPDATE audit_entries SET seq = -1 WHERE chain = '{CHAIN}' AND seq = {FIRST_BATCH}; "
            f"UPDATE audit_entries SET seq = {FIRST_BATCH} "
            f"WHERE chain = '{CHAIN}' AND seq = {MIDDLE_BATCH}; "
            f"UPDATE audit_entries SET seq = {MIDDLE_BATCH} WHERE chain = '{CHAIN}' AND seq = -1",
            FIRST_BATCH,
            ("previous hash",),
        ),
        (
            # a copy of the middle batch squeezed in after it: the rest moved up one
            f"UPDATE audit_entries SET seq = seq + 100 "
            f"WHERE chain = '{CHAIN}' AND seq > {MIDDLE_BATCH}; "
            f"UPDATE audit_entries SET seq = seq - 99 WHERE chain = '{CHAIN}' AND seq > 100; "
            f"INSERT INTO audit_entries SELECT chain, {MIDDLE_BATCH + 1}, event, actor, tenant, "
            "schedule_id, slot_key, at, data, prev_hash, hash, key_id, signature, seal "
            f"FROM audit_entries WHERE chain = '{CHAIN}' AND seq = {MIDDLE_BATCH}",
            MIDDLE_BATCH + 1,
            ("previous hash",),
        ),
    ],
    ids=["count edited", "digest edited", "runs edited", "deleted", "reordered", "inserted"],
)
def test_a_batch_entry_tampered_with_is_named(
    dispatched: Path, tamper: str, seq: int, words: Sequence[str]
) -> None:
    shell(dispatched, tamper + ";")
    assert_broken(verify(dispatched, "--full"), seq, *words)


def test_a_batch_entry_edited_and_rehashed_without_the_key_is_named(dispatched: Path) -> None:
    """The tamperer recomputes the hash of the edited entry (anyone can): its signature,
    which only the key makes, no longer matches."""
    (entry,) = [e for e in entries_of(dispatched) if e.seq == MIDDLE_BATCH]
    data = {**entry.data, "count": 2, "runs": [[4, 2]]}
    digest = content_hash(
        chain=entry.chain,
        seq=entry.seq,
        event=entry.event,
        actor=entry.actor,
        tenant=entry.tenant,
        schedule_id=entry.schedule_id,
        slot_key=entry.slot_key,
        at=entry.at,
        data=data,
        prev_hash=entry.prev_hash,
    )
    shell(
        dispatched,
        f"UPDATE audit_entries SET data = {literal(json.dumps(data))}, hash = '{digest}' "
        f"WHERE chain = '{CHAIN}' AND seq = {MIDDLE_BATCH};",
    )
    assert_broken(verify(dispatched, "--full"), MIDDLE_BATCH, "signature is not valid")


def test_a_forged_batch_entry_appended_for_a_forged_run_is_named(dispatched: Path) -> None:
    """A run added with a batch entry of its own, hashed right, signed without the key."""
    shell(
        dispatched,
        "INSERT INTO runs (id, tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, "
        "kind, state, dispatched_at, node_id) SELECT 10, tenant, schedule_id, schedule_name, "
        "schedule_id || '@x', slot_at, due_at, 'scheduled', 'dispatched', dispatched_at, "
        "node_id FROM runs WHERE id = 9;",
    )
    head = entries_of(dispatched)[-1]
    data = {"count": 1, "runs": [[10, 1]], "digest": "0" * 64}
    digest = content_hash(
        chain=CHAIN,
        seq=HEAD + 1,
        event="fires.dispatched",
        actor="node-1",
        tenant="default",
        schedule_id=None,
        slot_key=None,
        at=head.at,
        data=data,
        prev_hash=head.hash,
    )
    shell(
        dispatched,
        f"INSERT INTO audit_entries VALUES ('{CHAIN}', {HEAD + 1}, 'fires.dispatched', 'node-1', "
        f"'default', NULL, NULL, {head.at}, {literal(json.dumps(data))}, '{head.hash}', "
        f"'{digest}', '{head.key_id}', '{'0' * 64}', NULL);",
    )
    assert_broken(verify(dispatched, "--full"), HEAD + 1, "signature is not valid")


# -- truncation --------------------------------------------------------------------------------


def test_a_truncated_chain_is_caught_by_the_last_verification_mark(dispatched: Path) -> None:
    head_line(verify(dispatched))  # the mark is at 7
    shell(dispatched, f"DELETE FROM audit_entries WHERE chain = '{CHAIN}' AND seq > {FIRST_BATCH}")
    assert_broken(verify(dispatched), FIRST_BATCH + 1, "truncated")


@pytest.mark.parametrize(
    "full",
    [
        pytest.param(False, id="incremental"),
        pytest.param(True, id="full"),
    ],
)
def test_a_truncated_chain_is_caught_by_the_expected_head(dispatched: Path, full: bool) -> None:
    expected = head_line(verify(dispatched))
    # The tail and the verification mark both gone: only the head kept outside remains.
    shell(
        dispatched,
        f"DELETE FROM audit_entries WHERE chain = '{CHAIN}' AND seq > {FIRST_BATCH}; "
        "DELETE FROM audit_verified;",
    )
    args = ("--full",) if full else ()
    assert_broken(
        verify(dispatched, *args, "--expect-head", expected), FIRST_BATCH + 1, "truncated"
    )


# -- retention is not tampering ----------------------------------------------------------------


@pytest.fixture
def aged(tmp_path: Path) -> Path:
    """Three batches dispatched 40 days ago (real time: `vortos prune` runs on it); of their
    runs 1-4 and 6 ran to completion, 5 and 7-9 are still open (never settled)."""
    db = tmp_path / "vortos.db"
    start = (int(time.time() * 1000) - 40 * DAY_MS) // MINUTE_MS * MINUTE_MS
    dispatch(db, start, overlap=OverlapPolicy.ALLOW)
    with open_engine(db, clock=ManualClock(start + 5 * MINUTE_MS)) as engine:
        taken = claim(engine.storage, limit=9)
        assert sorted(f.run_id for f in taken.fires) == list(range(1, 10))
        report = engine.storage.fire_queue.settle(
            taken.token, "worker-a", [complete(i) for i in (1, 2, 3, 4, 6)]
        )
        assert sorted(report.acked) == [1, 2, 3, 4, 6]
    return db


def prune(db: Path) -> None:
    swept = run_cli("prune", db=db)
    assert swept.code == 0, swept.stderr
    assert query(db, "SELECT id FROM runs ORDER BY id") == [(5,), (7,), (8,), (9,)], swept.stderr


def test_runs_a_retention_sweep_pruned_are_not_tampering(aged: Path) -> None:
    assert verify(aged).code == 0
    prune(aged)
    for args in ((), ("--full",)):
        result = verify(aged, *args)
        assert result.code == 0, result.stdout + result.stderr
        assert "BROKEN" not in result.stdout
    # And the runs left are still held to their batches.
    shell(aged, "UPDATE runs SET slot_key = slot_key || 'x' WHERE id = 8;")
    assert_broken(verify(aged, "--full"), LAST_BATCH, "edited")


def test_an_unpruned_run_deleted_among_pruned_ones_is_still_named(aged: Path) -> None:
    prune(aged)  # runs 4 and 6 of the middle batch went, 5 (open) stayed
    shell(aged, "DELETE FROM fire_queue WHERE run_id = 5; DELETE FROM runs WHERE id = 5;")
    assert_broken(verify(aged, "--full"), MIDDLE_BATCH, "run 5", "deleted")


# -- keys: a stolen current key, a retired key, another database's chain ------------------------


def forge_from(
    db: Path, seq: int, ring_file: Path, *, mark: bool, keep_key_ids: bool = False
) -> None:
    """What a thief holding `ring_file` does: entry `seq` rewritten (a batch now says another
    node dispatched it), every entry after it re-hashed and re-signed with the stolen key (and
    re-sealed where the entry carries a seal), and with `mark` the verification mark signed
    again at the new head, so nothing the key can make is left inconsistent. With
    `keep_key_ids`, each entry keeps the key id it had (the signatures are still the stolen
    key's: no other is at hand)."""
    ring = load_keyring(db, key_file=ring_file, create=False)
    statements = []
    prev = ""
    last: AuditEntry | None = None
    for entry in entries_of(db):
        if entry.seq < seq:
            prev = entry.hash
            continue
        actor = "mallory" if entry.seq == seq else entry.actor
        event = AuditEvent(
            entry.event,
            actor=actor,
            tenant=entry.tenant,
            schedule_id=entry.schedule_id,
            slot_key=entry.slot_key,
            data=entry.data,
        )
        forged = seal(event, seq=entry.seq, at=entry.at, prev_hash=prev, keys=ring)
        if keep_key_ids:
            forged = dataclasses.replace(
                forged,
                key_id=entry.key_id,
                signature=ring.current.mac(entry_message(CHAIN, forged.seq, forged.hash)),
            )
        statements.append(rewrite(forged))
        prev = forged.hash
        last = forged
    assert last is not None
    if mark:
        key_id, signature = ring.sign(f"checkpoint:{CHAIN}:{last.seq}:{last.hash}")
        statements.append(
            f"UPDATE audit_verified SET seq = {last.seq}, hash = '{last.hash}', "
            f"key_id = '{key_id}', signature = '{signature}' WHERE chain = '{CHAIN}';"
        )
    shell(db, " ".join(statements))


@pytest.fixture(scope="module")
def sealed_once(dispatched_once: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`dispatched` after `vortos audit seal` (entry 8 seals epoch 0) and a change of epoch
    1 (entry 9), verified. Built once per module."""
    db = copy_database(dispatched_once, tmp_path_factory.mktemp("sealed"))
    done = run_cli("audit", "seal", db=db)
    assert done.code == 0, done.stderr
    paused = run_cli("schedule", "pause", "alpha", db=db)
    assert paused.code == 0, paused.stderr
    assert verify(db, "--full").code == 0
    return db


@pytest.fixture
def sealed(sealed_once: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of `sealed_once`, and the key file as a thief takes it now."""
    db = copy_database(sealed_once, tmp_path)
    stolen = tmp_path / "stolen.key"
    shutil.copyfile(default_key_file(db), stolen)
    assert "epoch 1 " in stolen.read_text()  # the evolved key: epoch 0's is gone from it
    return db, stolen


def test_a_stolen_key_cannot_forge_an_entry_of_a_sealed_epoch(sealed: tuple[Path, Path]) -> None:
    db, stolen = sealed
    forge_from(db, MIDDLE_BATCH, stolen, mark=False)
    # The forged chain is consistent: each hash covers its content and the one before.
    assert_broken(verify(db, "--full"), MIDDLE_BATCH, "signed with key", "forged")


def test_a_stolen_key_forgery_keeping_the_old_key_ids_fails(sealed: tuple[Path, Path]) -> None:
    """The sealed epoch's entries keep their key's id: the stolen key's HMACs do not match
    it, and the seal of the epoch's last entry cannot be made without that epoch's key."""
    db, stolen = sealed
    forge_from(db, MIDDLE_BATCH, stolen, mark=False, keep_key_ids=True)
    result = verify(db, "--full")
    assert result.code == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert any(
        f"audit chain {CHAIN} is broken at entry {seq}:" in result.stderr
        for seq in range(MIDDLE_BATCH, HEAD + 2)  # the forged entry .. the epoch's seal
    ), result.stderr
    assert "seal is not valid" in result.stderr or "signature is not valid" in result.stderr


def test_a_stolen_key_forgery_fails_with_the_public_key_alone(
    sealed: tuple[Path, Path], tmp_path: Path
) -> None:
    db, stolen = sealed
    public = tmp_path / "pub.json"
    assert run_cli("audit", "public-key", "-o", str(public), db=db).code == 0
    forge_from(db, MIDDLE_BATCH, stolen, mark=True)
    result = verify(db, "--public-key", str(public))
    said = result.stdout + result.stderr
    assert result.code == 1, said
    assert "Traceback" not in said
    assert f"audit chain {CHAIN} is broken at entry {MIDDLE_BATCH}:" in result.stderr, said


def test_a_stolen_key_forgery_with_its_mark_resigned_does_not_verify(
    sealed: tuple[Path, Path],
) -> None:
    db, stolen = sealed
    forge_from(db, MIDDLE_BATCH, stolen, mark=True)
    result = verify(db)
    assert result.code == 1, result.stdout + result.stderr


def test_an_entry_signed_with_a_retired_key_after_a_rotation_fails(
    dispatched: Path, tmp_path: Path
) -> None:
    old = tmp_path / "before-rotation.key"
    shutil.copyfile(default_key_file(dispatched), old)
    rotated = run_cli("audit", "rotate-key", db=dispatched)
    assert rotated.code == 0, rotated.stderr
    assert verify(dispatched, "--full").code == 0
    # An entry appended after the rotation, as the holder of the old key would sign it.
    ring = load_keyring(dispatched, key_file=old, create=False)
    head = entries_of(dispatched)[-1]
    assert head.event == "audit.key_rotated"
    forged = seal(
        AuditEvent("schedule.deleted", actor="mallory", tenant="default", data={"name": "alpha"}),
        seq=head.seq + 1,
        at=head.at + 1,
        prev_hash=head.hash,
        keys=ring,
    )
    shell(
        dispatched,
        f"INSERT INTO audit_entries VALUES ('{CHAIN}', {forged.seq}, '{forged.event}', "
        f"'mallory', 'default', NULL, NULL, {forged.at}, {literal(json.dumps(dict(forged.data)))}, "
        f"'{forged.prev_hash}', '{forged.hash}', '{forged.key_id}', '{forged.signature}', NULL);",
    )
    assert_broken(verify(dispatched, "--full"), forged.seq, "retired")


def test_a_chain_transplanted_from_another_database_with_the_same_key_fails(
    dispatched: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other" / "vortos.db"
    other.parent.mkdir()
    shutil.copyfile(default_key_file(dispatched), default_key_file(other))
    default_key_file(other).chmod(0o600)
    dispatch(other, T0)
    theirs = query(other, "SELECT database_id FROM audit_identity")[0][0]
    ours = query(dispatched, "SELECT database_id FROM audit_identity")[0][0]
    assert theirs != ours
    # Their tenant chain's rows in place of ours, signed with the very same key.
    rows = query(other, f"SELECT * FROM audit_entries WHERE chain = '{CHAIN}' ORDER BY seq")
    values = ", ".join("(" + ", ".join(literal(v) for v in row) + ")" for row in rows)
    shell(
        dispatched,
        f"DELETE FROM audit_entries WHERE chain = '{CHAIN}'; DELETE FROM audit_verified; "
        f"INSERT INTO audit_entries VALUES {values};",
    )
    assert_broken(verify(dispatched, "--full"), 1, "database", str(theirs), "another database")
