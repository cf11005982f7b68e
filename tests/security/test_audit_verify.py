"""`vortos audit verify` never claims more than it checked: each kind of tampering with a real
SQLite file (made with sqlite3 directly, as someone with write access to the file would), found
through the real CLI in a subprocess; the signed verification mark and the checkpoints checked
by --full; --expect-head with an export; and an account that may read no chain refused, never
told "intact" or "no entries" (real Unix accounts, the README's layouts)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine, IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.domain.access import Grant, Role
from engine.domain.audit import AuditEvent, tenant_chain
from engine.domain.timeutil import MINUTE_MS
from tests.conftest import T0, CliResult, run_cli
from tests.security.deployment import Accounts, Deployment, deployment

A, B = tenant_chain("a"), tenant_chain("b")
BIG = tenant_chain("big")
ENTRIES = 31  # in tenant:a and tenant:b each: the chain's opening, a create and 29 triggers
BIG_ENTRIES = 2_500  # checkpoints at 1000 and 2000


def seed_tenants(engine: Engine) -> None:
    for tenant in ("a", "b"):
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop", tenant=tenant),
            actor="alice",
        )
        for _ in range(ENTRIES - 2):
            engine.service.trigger("report", tenant=tenant, actor="bob")


@pytest.fixture
def audited(tmp_path: Path) -> Path:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        seed_tenants(engine)
    return db


@pytest.fixture
def big(tmp_path: Path) -> Path:
    """A chain long enough to hold signed checkpoints (every 1,000 entries)."""
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        for start in range(0, BIG_ENTRIES, 500):
            engine.storage.audit.append(
                [
                    AuditEvent("test.event", actor="bench", tenant="big", data={"i": i})
                    for i in range(start, start + 500)
                ]
            )
    return db


def tamper(db: Path, *statements: str) -> None:
    """What an account with write access to the file does: drop the guards, then edit."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("DROP TRIGGER IF EXISTS audit_entries_no_update")
        conn.execute("DROP TRIGGER IF EXISTS audit_entries_no_delete")
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def query(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.execute(sql))
    finally:
        conn.close()


def entry_hash(db: Path, chain: str, seq: int) -> str:
    ((found,),) = query(
        db, f"SELECT hash FROM audit_entries WHERE chain = '{chain}' AND seq = {seq}"
    )
    assert isinstance(found, str)
    return found


def verify(db: Path, *args: str) -> CliResult:
    return run_cli("audit", "verify", *args, db=db, timeout=120)


def assert_broken(result: CliResult, chain: str, seq: int, says: str) -> None:
    assert result.code == 1, result.stdout + result.stderr
    assert f"audit chain {chain} is broken at entry {seq}:" in result.stderr, result.stderr
    assert says in result.stderr, result.stderr
    assert "no tampering found" not in result.stderr
    assert "Traceback" not in result.stderr


def verified_once(db: Path) -> str:
    """Verify (which signs a mark at each head); the --expect-head of tenant:a it printed."""
    done = verify(db)
    assert done.code == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith(f"--expect-head {A}="))
    return line.split(" ", 1)[1]


# -- entries ---------------------------------------------------------------------------------


def test_an_edited_entry_breaks_the_chain_at_that_entry(audited: Path) -> None:
    tamper(audited, f"UPDATE audit_entries SET data = '{{}}' WHERE chain = '{A}' AND seq = 7")
    assert_broken(verify(audited, "--full"), A, 7, "content does not match its hash")


def test_a_deleted_entry_breaks_the_chain_where_it_was(audited: Path) -> None:
    tamper(audited, f"DELETE FROM audit_entries WHERE chain = '{A}' AND seq = 9")
    assert_broken(verify(audited, "--full"), A, 9, "missing (deleted?)")


def test_an_inserted_entry_breaks_the_chain_where_it_went_in(audited: Path) -> None:
    tamper(
        audited,
        f"UPDATE audit_entries SET seq = seq + 1000 WHERE chain = '{A}' AND seq >= 15",
        f"UPDATE audit_entries SET seq = seq - 999 WHERE chain = '{A}' AND seq >= 1015",
        "INSERT INTO audit_entries SELECT chain, 15, 'schedule.deleted', 'mallory', tenant, "
        "schedule_id, NULL, at, '{}', prev_hash, hash, key_id, signature, seal "
        f"FROM audit_entries WHERE chain = '{A}' AND seq = 16",
    )
    assert_broken(verify(audited, "--full"), A, 15, "content does not match its hash")


def test_reordered_entries_break_the_chain_at_the_first_moved(audited: Path) -> None:
    tamper(
        audited,
        f"UPDATE audit_entries SET seq = -5 WHERE chain = '{A}' AND seq = 5",
        f"UPDATE audit_entries SET seq = 5 WHERE chain = '{A}' AND seq = 6",
        f"UPDATE audit_entries SET seq = 6 WHERE chain = '{A}' AND seq = -5",
    )
    assert_broken(verify(audited, "--full"), A, 5, "previous hash")


def test_an_entry_rehashed_with_a_forged_signature_is_found(audited: Path) -> None:
    """Without the key, a recomputed hash cannot be signed: the signature gives it away."""
    tamper(
        audited,
        f"UPDATE audit_entries SET signature = '{'ab' * 32}' WHERE chain = '{A}' AND seq = 12",
    )
    assert_broken(verify(audited, "--full"), A, 12, "signature is not valid")


def test_an_entry_replayed_from_another_chain_at_the_same_seq_fails(audited: Path) -> None:
    """The hash and the signature cover the chain's name: tenant:a's first entry, valid there,
    copied over tenant:b's first (same seq, same genesis previous hash) is no entry of b's."""
    tamper(
        audited,
        f"DELETE FROM audit_entries WHERE chain = '{B}' AND seq = 1",
        f"INSERT INTO audit_entries SELECT '{B}', seq, event, actor, 'b', schedule_id, slot_key, "
        f"at, data, prev_hash, hash, key_id, signature, seal FROM audit_entries "
        f"WHERE chain = '{A}' AND seq = 1",
    )
    assert_broken(verify(audited, "--full", "--chain", B), B, 1, "content does not match")
    # The same row with its tenant left as a's is refused as well.
    tamper(audited, f"UPDATE audit_entries SET tenant = 'a' WHERE chain = '{B}' AND seq = 1")
    assert_broken(verify(audited, "--full", "--chain", B), B, 1, "content does not match")


# -- the tail and the signed verification mark -------------------------------------------------


def test_a_truncated_tail_is_found_by_full_through_the_signed_mark(audited: Path) -> None:
    """--full used to skip the mark, so a tail cut after a verification passed it."""
    verified_once(audited)
    tamper(audited, f"DELETE FROM audit_entries WHERE chain = '{A}' AND seq > 27")
    assert_broken(verify(audited, "--full"), A, 28, "truncated")
    assert_broken(verify(audited), A, 28, "truncated")


def test_a_truncated_tail_with_its_mark_deleted_is_found_by_a_checkpoint_past_the_head(
    big: Path,
) -> None:
    verify(big)
    tamper(
        big,
        f"DELETE FROM audit_entries WHERE chain = '{BIG}' AND seq > 1500",
        "DELETE FROM audit_verified",
    )
    assert_broken(verify(big, "--full"), BIG, 1501, "checkpoint was signed at entry 2000")
    assert_broken(verify(big), BIG, 1501, "truncated")


def test_a_tail_cut_with_its_mark_and_checkpoints_is_found_only_by_the_head_kept_outside(
    audited: Path,
) -> None:
    """Nothing left in the file remembers the tail: a full verify checks what is there (and
    says so), and the --expect-head noted earlier catches the cut."""
    expected = verified_once(audited)
    tamper(
        audited,
        f"DELETE FROM audit_entries WHERE chain = '{A}' AND seq > 27",
        "DELETE FROM audit_verified",
        "DELETE FROM audit_checkpoints",
    )
    honest = verify(audited, "--full")
    assert honest.code == 0, honest.stderr
    assert "checked now" in honest.stderr
    assert "keep these heads" in honest.stderr
    assert_broken(verify(audited, "--full", "--expect-head", expected), A, 28, "truncated")
    assert_broken(verify(audited, "--expect-head", expected), A, 28, "truncated")


def test_a_forged_mark_is_reported_and_never_trusted(audited: Path) -> None:
    """A mark written without the key, to make an incremental verify skip an edited entry,
    is a finding in either mode; it was silently ignored before."""
    tamper(
        audited,
        f"UPDATE audit_entries SET actor = 'mallory' WHERE chain = '{A}' AND seq = 20",
        "INSERT OR REPLACE INTO audit_verified VALUES "
        f"('{A}', 25, '{entry_hash(audited, A, 25)}', {T0}, 'k', '{'0' * 64}')",
    )
    # Signed with a key nobody knows, it vouches for nothing: the walk starts from the chain's
    # start and finds the edit (never trusted, never skipped quietly).
    assert_broken(verify(audited), A, 20, "content does not match")
    assert_broken(verify(audited, "--full"), A, 20, "content does not match")
    # Signed as if with the real key's id, the signature is still not the key's.
    ((key_id,),) = query(audited, f"SELECT key_id FROM audit_entries WHERE chain = '{A}' LIMIT 1")
    tamper(audited, f"UPDATE audit_verified SET key_id = '{key_id}' WHERE chain = '{A}'")
    assert_broken(verify(audited), A, 25, "mark's signature is not valid")


def test_a_mark_moved_to_another_chain_is_not_valid_there(audited: Path) -> None:
    """The mark's signature covers its chain: tenant:a's, copied to tenant:b at the same seq
    with b's hash there, does not let b's entries be trusted."""
    verified_once(audited)
    tamper(
        audited,
        f"DELETE FROM audit_verified WHERE chain = '{B}'",
        f"INSERT INTO audit_verified SELECT '{B}', seq, '{entry_hash(audited, B, ENTRIES)}', "
        f"verified_at, key_id, signature FROM audit_verified WHERE chain = '{A}'",
    )
    assert_broken(verify(audited), B, ENTRIES, "mark's signature is not valid")


def test_an_entry_rewritten_at_the_mark_is_found(audited: Path) -> None:
    verified_once(audited)
    tamper(
        audited,
        f"UPDATE audit_entries SET hash = '{'1' * 64}' WHERE chain = '{A}' AND seq = {ENTRIES}",
    )
    assert_broken(verify(audited), A, ENTRIES, "changed since (rewritten)")
    assert_broken(verify(audited, "--full"), A, ENTRIES, "content does not match its hash")


# -- checkpoints ---------------------------------------------------------------------------------


def test_a_deleted_checkpoint_is_found(big: Path) -> None:
    tamper(big, f"DELETE FROM audit_checkpoints WHERE chain = '{BIG}' AND seq = 1000")
    assert_broken(verify(big, "--full"), BIG, 1000, "checkpoint signed at this sequence is missing")


def test_a_checkpoint_naming_another_hash_is_found(big: Path) -> None:
    tamper(
        big,
        f"UPDATE audit_checkpoints SET hash = '{'2' * 64}' WHERE chain = '{BIG}' AND seq = 2000",
    )
    assert_broken(verify(big, "--full"), BIG, 2000, "differs from the checkpoint")


def test_a_checkpoint_with_a_forged_signature_is_found(big: Path) -> None:
    tamper(
        big,
        f"UPDATE audit_checkpoints SET signature = '{'0' * 64}' "
        f"WHERE chain = '{BIG}' AND seq = 1000",
    )
    assert_broken(verify(big, "--full"), BIG, 1000, "signed point's signature is not valid")


def test_a_forged_checkpoint_past_the_head_is_found(big: Path) -> None:
    tamper(
        big,
        f"INSERT INTO audit_checkpoints VALUES ('{BIG}', 3000, '{'3' * 64}', 'k', '{'0' * 64}')",
    )
    assert_broken(verify(big, "--full"), BIG, 3000, "checkpoint's signature is not valid")


def test_full_reports_the_checkpoints_it_compared(big: Path) -> None:
    done = verify(big, "--full", "--json")
    assert done.code == 0, done.stderr
    (report,) = json.loads(done.stdout)
    # The chain's opening and its 2,500 entries.
    assert (report["mode"], report["checked"], report["checkpoints_checked"]) == ("full", 2501, 2)
    assert report["trusted_through"] == 0
    assert "2501 entries checked now in 1 chain(s), with 2 signed checkpoint(s)" in done.stderr


# -- what an incremental verify says ------------------------------------------------------------


def test_an_edit_before_the_mark_is_trusted_by_incremental_which_says_so_and_full_finds_it(
    audited: Path,
) -> None:
    verified_once(audited)
    tamper(audited, f"UPDATE audit_entries SET actor = 'mallory' WHERE chain = '{A}' AND seq = 5")
    trusted = verify(audited)
    assert trusted.code == 0, trusted.stderr
    assert "every chain is intact" not in trusted.stderr + trusted.stdout
    assert "0 entries checked now in 2 chain(s)" in trusted.stderr
    assert f"{A} entries 1..{ENTRIES} (mark of " in trusted.stderr
    assert "trusted from the signed mark" in trusted.stderr
    assert "vortos audit verify --full" in trusted.stderr
    as_json = verify(audited, "--json", "--chain", A)
    (report,) = json.loads(as_json.stdout)
    assert report["mode"] == "incremental"
    assert report["trusted_through"] == report["resumed_from"] == ENTRIES
    assert isinstance(report["mark_at"], int)
    assert report["checked"] == 0
    assert_broken(verify(audited, "--full"), A, 5, "content does not match its hash")


def test_an_edit_of_the_marked_entry_that_keeps_its_hash_is_found_by_incremental(
    audited: Path,
) -> None:
    """The attacker's B1: the head entry's content edited, its hash column kept. The mark
    names the entry by its hash; the entry must still hash to it."""
    verified_once(audited)
    tamper(
        audited,
        f"UPDATE audit_entries SET data = '{{\"count\": 2}}' WHERE chain = '{A}' "
        f"AND seq = {ENTRIES}",
    )
    assert_broken(verify(audited), A, ENTRIES, "changed since (rewritten)")
    assert_broken(verify(audited), A, ENTRIES, "changed since (rewritten)")  # no new mark


def test_an_edit_of_the_expected_head_entry_that_keeps_its_hash_is_found(audited: Path) -> None:
    """--expect-head must find its entry unchanged by content, not by the hash column: the
    kept head is below the mark, so only the expectation looks at it."""
    kept = f"{A}=10:{entry_hash(audited, A, 10)}"
    verified_once(audited)  # the mark is at the head, above the kept entry
    tamper(audited, f"UPDATE audit_entries SET actor = 'mallory' WHERE chain = '{A}' AND seq = 10")
    broken = run_cli("audit", "verify", "--chain", A, "--expect-head", kept, db=audited)
    assert_broken(broken, A, 10, "the entry at the head recorded earlier has changed")


def test_an_incremental_verify_after_a_full_one_found_a_break_finds_it_again(
    audited: Path,
) -> None:
    """The attacker's U2: a full verify finds an edit below the mark; the mark must not go on
    vouching for it, so the next incremental verify reports the break too."""
    verified_once(audited)
    tamper(audited, f"UPDATE audit_entries SET actor = 'mallory' WHERE chain = '{A}' AND seq = 5")
    assert_broken(verify(audited, "--full"), A, 5, "content does not match its hash")
    assert_broken(verify(audited), A, 5, "content does not match its hash")
    (report,) = json.loads(verify(audited, "--json", "--chain", A).stdout)
    assert report["intact"] is False
    assert report["trusted_through"] == 4  # what was verified good, no more


# -- --expect-head with an export -----------------------------------------------------------------


@pytest.fixture
def exported(audited: Path) -> tuple[Path, str]:
    head = verified_once(audited)
    out = audited.with_name("audit.jsonl")
    done = run_cli("audit", "export", "--output", str(out), db=audited)
    assert done.code == 0, done.stderr
    return out, head


def test_expect_head_with_file_passes_when_the_export_holds_that_entry(
    audited: Path, exported: tuple[Path, str]
) -> None:
    out, head = exported
    done = verify(audited, "--file", str(out), "--expect-head", head)
    assert done.code == 0, done.stderr
    assert "the export was checked from each chain's start" in done.stderr


def test_expect_head_with_file_fails_on_an_export_cut_short(
    audited: Path, exported: tuple[Path, str]
) -> None:
    out, _head = exported
    kept = [
        line
        for line in out.read_text().splitlines()
        # Its entries past 27 and its signed head line, as someone cutting it would.
        if not (json.loads(line).get("chain") == A and json.loads(line).get("seq", 0) > 27)
        and json.loads(line).get("head", {}).get("chain") != A
    ]
    out.write_text("\n".join(kept) + "\n")
    # The export's signed roster names the head the chain should reach: the cut is told even
    # without a head kept elsewhere.
    assert_broken(verify(audited, "--file", str(out)), A, 28, "cut short")


def test_expect_head_with_file_fails_when_the_export_lacks_the_chain_or_holds_another_entry(
    audited: Path, exported: tuple[Path, str]
) -> None:
    out, head = exported
    seq = head.split("=", 1)[1].split(":", 1)[0]
    other = f"{A}={seq}:{'4' * 64}"
    assert_broken(
        verify(audited, "--file", str(out), "--expect-head", other), A, ENTRIES, "changed"
    )
    kept = [line for line in out.read_text().splitlines() if json.loads(line).get("chain") != A]
    out.write_text("\n".join(kept) + "\n")
    assert_broken(verify(audited, "--file", str(out), "--expect-head", head), A, 1, "cut short")


# -- who may verify: real Unix accounts ---------------------------------------------------------


def seed_governed(made: Accounts) -> object:
    def seed(engine: Engine) -> None:
        seed_tenants(engine)
        now = engine.clock.now_ms()
        engine.storage.operators.grant(Grant(made.alice, Role.ADMIN), by="root", at=now)
        engine.storage.operators.grant(Grant(made.bob, Role.VIEWER, "a"), by="root", at=now)

    return seed


def assert_refused_without_a_claim(result: subprocess.CompletedProcess[str], who: str) -> None:
    assert result.returncode == 4, result.stdout + result.stderr
    assert "nothing was verified" in result.stderr
    assert f"vortos operators grant {who} viewer --tenant T" in result.stderr
    for claim in ("intact", "no audit entries", "no tampering found", "checked now"):
        assert claim not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def governed(ops: Accounts) -> Iterator[Deployment]:
    with deployment(ops, seed_governed(ops)) as site:  # type: ignore[arg-type]
        tamper(
            site.db, f"UPDATE audit_entries SET actor = 'mallory' WHERE chain = '{A}' AND seq = 3"
        )
        yield site


def test_an_account_with_no_role_is_refused_through_the_socket_on_a_tampered_database(
    governed: Deployment, ops: Accounts
) -> None:
    assert_refused_without_a_claim(governed.as_account(ops.carol, "audit", "verify"), ops.carol)
    assert_refused_without_a_claim(
        governed.as_account(ops.carol, "audit", "verify", "--full"), ops.carol
    )
    named = governed.as_account(ops.carol, "audit", "verify", "--chain", A)
    assert named.returncode == 4, named.stderr
    assert "may not read audit chain" in named.stderr


def test_a_tenant_viewer_verifies_its_own_chain_and_is_refused_every_other(
    governed: Deployment, ops: Accounts
) -> None:
    found = governed.as_account(ops.bob, "audit", "verify", "--full")
    assert found.returncode == 1, found.stderr  # its own chain, tampered: found
    assert f"audit chain {A} is broken at entry 3" in found.stderr
    for chain in ("system", B, tenant_chain("nosuch")):
        # Another tenant's chain, or one that does not exist: the same refusal (no oracle).
        refused = governed.as_account(ops.bob, "audit", "verify", "--chain", chain)
        assert refused.returncode == 4, refused.stdout + refused.stderr
        assert "may not read audit chain" in refused.stderr


def test_an_account_with_no_role_reading_the_file_directly_is_refused(
    governed: Deployment, ops: Accounts
) -> None:
    """Without the socket, a group member reads the group-readable file itself (the service
    running, as the README's layout has it): it may not verify what it may not read, and
    learns nothing about the chains."""
    done = governed.as_account(ops.carol, "audit", "verify", socket_on=False)
    assert_refused_without_a_claim(done, ops.carol)
    full = governed.as_account(ops.carol, "audit", "verify", "--full", socket_on=False)
    assert_refused_without_a_claim(full, ops.carol)


def test_what_was_trusted_travels_over_the_socket(governed: Deployment, ops: Accounts) -> None:
    """The server verifies (it holds the key); the operator is told the same facts."""
    first = governed.as_account(ops.alice, "audit", "verify", "--chain", B, "--json")
    assert first.returncode == 0, first.stderr
    again = governed.as_account(ops.alice, "audit", "verify", "--chain", B, "--json")
    (report,) = json.loads(again.stdout)
    assert (report["mode"], report["trusted_through"], report["checked"]) == (
        "incremental",
        ENTRIES,
        0,
    )
    assert isinstance(report["mark_at"], int)
    assert f"{B} entries 1..{ENTRIES} (mark of " in again.stderr
    full = governed.as_account(ops.alice, "audit", "verify", "--chain", B, "--full", "--json")
    (report,) = json.loads(full.stdout)
    # --full walks every entry, to the head, trusting none.
    assert (report["mode"], report["trusted_through"]) == ("full", 0)
    assert report["checked"] == report["head_seq"] >= ENTRIES
    broken = governed.as_account(ops.alice, "audit", "verify", "--full")
    assert broken.returncode == 1
    assert f"audit chain {A} is broken at entry 3" in broken.stderr
