"""What an attack from outside broke in issue 16's audit chain, each now a test: a chain deleted
whole, an archive carrying away a tampered ledger, a failing verify that moved its mark onto the
bad entry, an export cut short, an auditor without the database, a routine seal over marks of
the old kind, a mistyped archive directory, an unsigned key start time. Real files, the real
CLI, the sqlite3 shell for the tampering (helpers of test_audit_tamper)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import run_cli
from tests.integration.test_audit_tamper import (
    CHAIN,
    FIRST_BATCH,
    HEAD,
    MIDDLE_BATCH,
    assert_broken,
    dispatched,
    dispatched_once,
    query,
    shell,
    verify,
)

__all__ = ["dispatched", "dispatched_once"]  # the fixtures, imported for these tests


def test_a_chain_deleted_whole_is_named_by_a_full_verify(dispatched: Path) -> None:
    shell(
        dispatched,
        f"DELETE FROM audit_entries WHERE chain = '{CHAIN}'; "
        f"DELETE FROM audit_verified WHERE chain = '{CHAIN}'; "
        f"DELETE FROM audit_chains WHERE chain = '{CHAIN}'; "
        f"DELETE FROM audit_checkpoints WHERE chain = '{CHAIN}';",
    )
    result = verify(dispatched, "--full")
    assert result.code == 1, result.stdout + result.stderr
    assert "its whole chain was deleted" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_chain_deleted_whole_is_named_against_the_anchors(dispatched: Path) -> None:
    assert run_cli("audit", "anchor", db=dispatched).code == 0
    anchors = dispatched.with_name(dispatched.name + ".anchors.jsonl")
    shell(
        dispatched,
        f"DELETE FROM audit_entries WHERE chain = '{CHAIN}'; "
        f"DELETE FROM audit_verified WHERE chain = '{CHAIN}'; "
        f"DELETE FROM audit_chains WHERE chain = '{CHAIN}';",
    )
    result = verify(dispatched, "--anchors", str(anchors))
    assert result.code == 1, result.stdout + result.stderr
    assert CHAIN in result.stderr
    assert "truncated" in result.stderr


def test_an_archive_refuses_a_chain_whose_ledger_does_not_verify(
    dispatched: Path, tmp_path: Path
) -> None:
    shell(
        dispatched,
        "DROP TRIGGER IF EXISTS runs_legal_transition; "
        "UPDATE runs SET slot_key = 'x' || slot_key WHERE id = 2;",
    )
    entries = f"SELECT count(*) FROM audit_entries WHERE chain = '{CHAIN}'"
    before = query(dispatched, entries)
    result = run_cli("audit", "archive", "--before", "1s", "-o", str(tmp_path / "a"), db=dispatched)
    assert result.code == 1, result.stdout + result.stderr
    assert "does not verify" in result.stderr
    assert query(dispatched, entries) == before  # nothing pruned


def test_a_run_row_of_an_archived_batch_is_still_checked(dispatched: Path, tmp_path: Path) -> None:
    archive = tmp_path / "a"
    assert (
        run_cli("audit", "archive", "--before", "1s", "-o", str(archive), db=dispatched).code == 0
    )
    shell(
        dispatched,
        "DROP TRIGGER IF EXISTS runs_legal_transition; "
        "UPDATE runs SET slot_key = 'x' || slot_key WHERE id = 2;",
    )
    result = verify(dispatched, "--with-archive", str(archive))
    assert result.code == 1, result.stdout + result.stderr
    assert "run rows of this dispatch batch were edited" in result.stderr


def test_a_failing_full_verify_leaves_no_mark_on_the_bad_entry(dispatched: Path) -> None:
    assert verify(dispatched).code == 0  # a mark at the head
    shell(
        dispatched,
        "DROP TRIGGER IF EXISTS runs_legal_transition; "
        "UPDATE runs SET slot_key = 'x' || slot_key WHERE id = 4;",  # of the middle batch
    )
    assert_broken(verify(dispatched, "--full"), MIDDLE_BATCH, "run rows")
    marked = query(dispatched, f"SELECT seq FROM audit_verified WHERE chain = '{CHAIN}'")
    assert marked == [(MIDDLE_BATCH - 1,)]
    # The next incremental verify still finds it: nothing before it trusts the bad batch.
    assert_broken(verify(dispatched), MIDDLE_BATCH, "run rows")


def exported(db: Path, tmp_path: Path) -> tuple[list[str], Path]:
    out = tmp_path / "ex.jsonl"
    pub = tmp_path / "pub.json"
    assert run_cli("audit", "export", "-o", str(out), db=db).code == 0
    assert run_cli("audit", "public-key", "-o", str(pub), db=db).code == 0
    return out.read_text().splitlines(), pub


def verify_lines(db: Path, tmp_path: Path, lines: list[str], pub: Path, name: str) -> str:
    cut = tmp_path / name
    cut.write_text("\n".join(lines) + "\n")
    result = verify(db, "--file", str(cut), "--public-key", str(pub))
    assert result.code == 1, (name, result.stdout + result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def test_an_export_cut_short_is_never_intact(dispatched: Path, tmp_path: Path) -> None:
    lines, pub = exported(dispatched, tmp_path)
    assert (
        verify(dispatched, "--file", str(tmp_path / "ex.jsonl"), "--public-key", str(pub)).code == 0
    )
    # A chain left out, its head line with it (the signed roster still names it).
    without = [line for line in lines if f'"chain": "{CHAIN}"' not in line]
    assert "signed list" in verify_lines(dispatched, tmp_path, without, pub, "a.jsonl")
    # The chain cut back to its sealed opening, its head line dropped.
    opening_only = [
        line
        for line in lines
        if f'"chain": "{CHAIN}"' not in line or ('"seq": 1,' in line and '"event"' in line)
    ]
    said = verify_lines(dispatched, tmp_path, opening_only, pub, "b.jsonl")
    assert "signed list says this chain ends at" in said or "cannot be verified" in said
    # The roster itself removed: nothing to tell a cut by.
    no_roster = [line for line in lines if '"roster"' not in line]
    assert "signed list of chains" in verify_lines(dispatched, tmp_path, no_roster, pub, "c.jsonl")


def test_an_auditor_verifies_the_archive_without_the_database(
    dispatched: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "a"
    pub = tmp_path / "pub.json"
    assert (
        run_cli("audit", "archive", "--before", "1s", "-o", str(archive), db=dispatched).code == 0
    )
    assert run_cli("audit", "public-key", "-o", str(pub), db=dispatched).code == 0
    auditor = tmp_path / "auditor"
    auditor.mkdir()
    shutil.copytree(archive, auditor / "a")
    shutil.copyfile(pub, auditor / "pub.json")
    result = run_cli(
        "audit",
        "verify",
        "--with-archive",
        str(auditor / "a"),
        "--public-key",
        str(auditor / "pub.json"),
        db=auditor / "no-such.db",
    )
    assert result.code == 0, result.stdout + result.stderr
    assert "with the public key only" in result.stderr
    assert not (auditor / "no-such.db").exists()


def test_a_seal_over_marks_of_the_old_kind_is_not_taken_for_tampering(dispatched: Path) -> None:
    # A mark as versions before epochs signed it: HMAC by the epoch's key (64 hex digits).
    assert verify(dispatched).code == 0
    shell(dispatched, f"UPDATE audit_verified SET signature = '{'ab' * 32}'")
    assert run_cli("audit", "seal", db=dispatched).code == 0
    result = verify(dispatched)
    assert result.code == 0, result.stdout + result.stderr


def test_a_mistyped_archive_directory_is_refused_and_not_created(
    dispatched: Path, tmp_path: Path
) -> None:
    typo = tmp_path / "typo" / "deep" / "archive"
    entries = f"SELECT count(*) FROM audit_entries WHERE chain = '{CHAIN}'"
    before = query(dispatched, entries)
    result = run_cli("audit", "archive", "--before", "1s", "-o", str(typo), db=dispatched)
    assert result.code == 2, result.stdout + result.stderr
    assert "does not exist" in result.stderr
    assert not (tmp_path / "typo").exists()
    assert query(dispatched, entries) == before


def test_a_key_start_time_edited_breaks_the_lineage_and_stops_writers(dispatched: Path) -> None:
    assert run_cli("audit", "seal", db=dispatched).code == 0
    shell(dispatched, "UPDATE audit_keys SET started_at = 0 WHERE epoch = 1")
    result = verify(dispatched, "--full")
    assert result.code == 1
    assert "not endorsed" in result.stderr
    refused = run_cli("schedule", "pause", "alpha", db=dispatched)
    assert refused.code == 2, refused.stdout + refused.stderr
    assert "lineage does not hold" in refused.stderr
    assert query(dispatched, f"SELECT max(seq) FROM audit_entries WHERE chain = '{CHAIN}'") == [
        (HEAD + 1,)  # the seal's entry, and nothing signed after the edit
    ]


def test_the_export_roster_names_every_chain_it_holds(dispatched: Path, tmp_path: Path) -> None:
    lines, _ = exported(dispatched, tmp_path)
    roster = json.loads(lines[-1])["roster"]
    assert CHAIN in roster["heads"]
    assert roster["heads"][CHAIN].startswith(f"{HEAD}:")
    assert FIRST_BATCH < HEAD
