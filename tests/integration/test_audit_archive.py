"""Archiving the audit chain (engine.governance.archive) on real SQLite files (and once on
PostgreSQL, through its prune trigger): archive then verify end to end with the public key
only; each kind of tampering with the archive, its manifest or the anchor is found and named;
a legal hold keeps its chain; archiving twice changes nothing; a run killed between writing
and pruning leaves everything verifiable; the CLI refuses bad input with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.api import Engine
from engine.backends.sql.audit import SqlAuditLog
from engine.domain.audit import tenant_chain
from engine.domain.timeutil import DAY_MS, MINUTE_MS
from engine.governance.archive import (
    ArchiveVerification,
    archive,
    read_manifest,
    verify_with_archive,
)
from engine.retention import RetentionSettings
from engine.retention.audit_upkeep import archive_after_sweep
from tests.conftest import T0, run_cli
from tests.pg import fresh_schema, pg_engine

CHAIN = tenant_chain("default")
OLD = 41  # entries made at T0 in tenant:default (its opening, a create, then triggers)


def fill(engine: Engine, tenant: str = "default", count: int = OLD) -> None:
    engine.service.create(
        ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop", tenant=tenant),
        actor="alice",
    )
    for _ in range(count - 2):  # after the chain's opening and the create
        engine.service.trigger("report", actor="bob", tenant=tenant)


def log_of(engine: Engine) -> SqlAuditLog:  # type: ignore[type-arg]
    audit = engine.storage.audit
    assert isinstance(audit, SqlAuditLog)
    return audit


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Engine, ManualClock, Path]]:
    """A database with OLD entries at T0 and two a day later, and an archive directory."""
    clock = ManualClock(T0)
    engine = open_engine(tmp_path / "vortos.db", clock=clock)
    fill(engine)
    clock.advance(DAY_MS / 1000)
    engine.service.trigger("report", actor="bob")
    engine.service.trigger("report", actor="bob")
    yield engine, clock, tmp_path / "archive"
    engine.close()


def public_key(engine: Engine) -> tuple[str, str, str]:
    """What `vortos audit public-key` hands an auditor: the database id and root key."""
    identity = log_of(engine).identity()
    assert identity is not None
    root = min(identity[1], key=lambda p: p.epoch)
    return identity[0], root.key_id, root.public_key


def archived(engine: Engine, clock: ManualClock, folder: Path, **kwargs: object) -> int:
    report = archive(
        log_of(engine),
        folder,
        before_ms=T0 + 1,
        now_ms=clock.now_ms(),
        **kwargs,  # type: ignore[arg-type]
    )
    return report.archived


def check(engine: Engine, folder: Path | None, **kwargs: object) -> ArchiveVerification:
    return verify_with_archive(
        folder,
        log=log_of(engine),
        keys=log_of(engine).keys(),
        **kwargs,  # type: ignore[arg-type]
    )


def problem_of(result: ArchiveVerification) -> str:
    assert not result.intact, result.to_json()
    found = [c.problem.reason for c in result.chains if c.problem is not None]
    return " | ".join(found + result.problems)


def entries_file(folder: Path, index: int = 0) -> Path:
    return sorted(folder.glob("*.jsonl"))[index]


def manifest_file(folder: Path, index: int = 0) -> Path:
    return sorted(folder.glob("*.manifest.json"))[index]


# -- intact --------------------------------------------------------------------------------


def test_archive_then_verify_end_to_end_with_the_public_key_only(
    site: tuple[Engine, ManualClock, Path],
) -> None:
    engine, clock, folder = site
    assert archived(engine, clock, folder) == OLD
    log = log_of(engine)
    assert [e.seq for e in log.entries(CHAIN)] == [OLD + 1, OLD + 2]  # pruned, head kept
    anchor = log.anchor(CHAIN)
    assert anchor is not None
    assert anchor.seq == OLD
    manifest = read_manifest(manifest_file(folder))
    assert (manifest.first_seq, manifest.last_seq, manifest.count) == (1, OLD, OLD)
    assert manifest.database_id in manifest.entries_file
    assert oct(manifest_file(folder).stat().st_mode & 0o777) == "0o600"
    # With the secret key, archive and database.
    assert check(engine, folder).intact
    # An auditor: the archive alone, the root public key only.
    offline = verify_with_archive(folder, log=None, public_key=public_key(engine))
    assert offline.intact, offline.to_json()
    assert offline.chains[0].archived == OLD


def test_archiving_twice_is_a_no_op(site: tuple[Engine, ManualClock, Path]) -> None:
    engine, clock, folder = site
    archived(engine, clock, folder)
    files = sorted(p.name for p in folder.iterdir())
    anchor = log_of(engine).anchor(CHAIN)
    assert archived(engine, clock, folder) == 0
    assert sorted(p.name for p in folder.iterdir()) == files
    assert log_of(engine).anchor(CHAIN) == anchor


def test_a_backlog_becomes_several_files_walked_in_order(
    site: tuple[Engine, ManualClock, Path],
) -> None:
    engine, clock, folder = site
    assert archived(engine, clock, folder, file_entries=15) == OLD
    assert len(list(folder.glob("*.jsonl"))) == 3
    assert check(engine, folder).intact
    assert verify_with_archive(folder, log=None, public_key=public_key(engine)).intact


def test_a_legal_hold_keeps_its_tenants_chain_in_the_database(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with open_engine(tmp_path / "vortos.db", clock=clock) as engine:
        fill(engine, "default", 10)
        fill(engine, "bank", 10)
        engine.service.set_retention("bank", 0, actor="alice", reason="litigation")
        clock.advance(DAY_MS / 1000)
        engine.service.trigger("report", actor="bob")
        engine.service.trigger("report", actor="bob", tenant="bank")
        report = archive(
            log_of(engine),
            tmp_path / "archive",
            before_ms=T0 + 1,
            now_ms=clock.now_ms(),
            held_tenants=["bank"],
        )
        assert report.held == [tenant_chain("bank")]
        assert {f.chain for f in report.files} == {CHAIN}
        bank = log_of(engine).entries(tenant_chain("bank"))
        assert bank[0].seq == 1
        assert log_of(engine).anchor(tenant_chain("bank")) is None


def test_the_sweeper_archives_when_its_settings_name_a_directory(
    site: tuple[Engine, ManualClock, Path],
) -> None:
    engine, clock, folder = site
    off = archive_after_sweep(engine.storage, clock, RetentionSettings(days=1))
    assert off is None
    clock.advance(DAY_MS / 1000)
    done = archive_after_sweep(
        engine.storage,
        clock,
        RetentionSettings(days=30, audit_archive_dir=str(folder), audit_archive_days=1),
    )
    assert done is not None
    assert done["archived"] == OLD
    assert RetentionSettings.from_payload(
        RetentionSettings(audit_archive_dir=str(folder)).to_payload()
    ).audit_archive_dir == str(folder)
    assert "audit_archive_dir" not in RetentionSettings().to_payload()


# -- tampering -----------------------------------------------------------------------------


def _rewrite(path: Path, edit: object) -> None:
    lines = path.read_text().splitlines()
    lines = edit(lines)  # type: ignore[operator]
    path.write_text("".join(line + "\n" for line in lines))


def _edit_entry(lines: list[str]) -> list[str]:
    entry = json.loads(lines[9])
    entry["actor"] = "mallory"
    lines[9] = json.dumps(entry, sort_keys=True)
    return lines


@pytest.mark.parametrize(
    ("tamper", "says"),
    [
        (_edit_entry, "line 10: its content does not match its hash"),
        (lambda ls: ls[:9] + ls[10:], "entry 10 is missing"),
        (lambda ls: [*ls[:9], ls[10], ls[9], *ls[11:]], "entry 10 is missing"),
        (lambda ls: [*ls[:10], ls[9], *ls[10:]], "out of order or repeated"),
        (lambda ls: ls[:-1], "ends at entry 40, its manifest at 41 (truncated)"),
        (lambda ls: [*ls[:5], "{not json", *ls[5:]], "line 6 is not an audit entry"),
    ],
    ids=["edited", "deleted", "reordered", "inserted", "truncated", "garbage"],
)
def test_a_tampered_archive_file_is_named(
    site: tuple[Engine, ManualClock, Path], tamper: object, says: str
) -> None:
    engine, clock, folder = site
    archived(engine, clock, folder)
    _rewrite(entries_file(folder), tamper)
    assert says in problem_of(check(engine, folder))
    offline = verify_with_archive(folder, log=None, public_key=public_key(engine))
    assert says in problem_of(offline)


def test_an_edited_manifest_is_named(site: tuple[Engine, ManualClock, Path]) -> None:
    engine, clock, folder = site
    archived(engine, clock, folder)
    path = manifest_file(folder)
    value = json.loads(path.read_text())
    value["count"] = 40
    path.write_text(json.dumps(value))
    assert "is not validly signed (edited or forged)" in problem_of(check(engine, folder))


def test_a_missing_archive_file_is_a_gap(site: tuple[Engine, ManualClock, Path]) -> None:
    engine, clock, folder = site
    archived(engine, clock, folder, file_entries=15)
    entries_file(folder, 1).unlink()  # the middle file's entries
    assert "is missing" in problem_of(check(engine, folder))
    manifest_file(folder, 1).unlink()  # and its manifest: a gap between two files
    assert "entries 16..30 are in no archive file" in problem_of(check(engine, folder))


def test_a_missing_last_archive_is_found_from_the_anchor(
    site: tuple[Engine, ManualClock, Path],
) -> None:
    engine, clock, folder = site
    archived(engine, clock, folder, file_entries=15)
    entries_file(folder, 2).unlink()
    manifest_file(folder, 2).unlink()
    assert "entries 31..41 were archived" in problem_of(check(engine, folder))


def _anchor_sql(db: Path, sql: str) -> None:
    conn = apsw.Connection(str(db))
    conn.execute(sql)
    conn.close()


def test_an_edited_anchor_is_named(site: tuple[Engine, ManualClock, Path], tmp_path: Path) -> None:
    engine, clock, folder = site
    archived(engine, clock, folder)
    _anchor_sql(tmp_path / "vortos.db", "UPDATE audit_anchors SET seq = 40")
    assert "anchor" in problem_of(check(engine, folder))
    _anchor_sql(tmp_path / "vortos.db", "UPDATE audit_anchors SET seq = 41, at = at + 1")
    assert check(engine, folder).intact  # `at` is not signed: only where the anchor points
    _anchor_sql(tmp_path / "vortos.db", "UPDATE audit_anchors SET archive = 'other'")
    assert "anchor is not validly signed" in problem_of(check(engine, folder))


def test_an_older_genuine_anchor_put_back_does_not_match_the_archive(
    site: tuple[Engine, ManualClock, Path], tmp_path: Path
) -> None:
    engine, clock, folder = site
    archived(engine, clock, folder, file_entries=15)
    # Replay the (validly signed) anchor of the first file: the archive goes on past it.
    first = read_manifest(manifest_file(folder, 0))
    db = tmp_path / "vortos.db"
    conn = apsw.Connection(str(db))
    from engine.backends.sql.audit import anchor_message  # noqa: PLC0415

    ring = log_of(engine).keys()
    signature = ring.seal(anchor_message(CHAIN, first.last_seq, first.last_hash, first.name))
    conn.execute(
        "UPDATE audit_anchors SET seq = ?, hash = ?, archive = ?, signature = ?",
        (first.last_seq, first.last_hash, first.name, signature),
    )
    conn.close()
    says = problem_of(check(engine, folder))
    assert "entry 16 is missing" in says


def test_an_archive_of_another_database_is_refused(
    site: tuple[Engine, ManualClock, Path], tmp_path: Path
) -> None:
    engine, clock, folder = site
    archived(engine, clock, folder)
    clock2 = ManualClock(T0)
    with open_engine(tmp_path / "other.db", clock=clock2) as other:
        fill(other)
        says = problem_of(verify_with_archive(folder, log=None, public_key=public_key(other)))
    assert "another deployment's database" in says


# -- crashes -------------------------------------------------------------------------------

KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from engine import ManualClock, open_engine
    from engine.governance.archive import archive

    db, folder, stage, before, now = sys.argv[1:6]

    def hook(reached, chain):
        if reached == stage:
            os.kill(os.getpid(), signal.SIGKILL)

    engine = open_engine(Path(db), clock=ManualClock(int(now)))
    archive(engine.storage.audit, Path(folder), before_ms=int(before), now_ms=int(now), hook=hook)
    """
)


@pytest.mark.parametrize("stage", ["verified", "written"])
def test_an_archive_killed_before_it_pruned_leaves_everything_verifiable(
    site: tuple[Engine, ManualClock, Path], tmp_path: Path, stage: str
) -> None:
    engine, clock, folder = site
    db = tmp_path / "vortos.db"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED,
            str(db),
            str(folder),
            stage,
            str(T0 + 1),
            str(clock.now_ms()),
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -9, done.stderr
    assert log_of(engine).anchor(CHAIN) is None
    assert log_of(engine).entries(CHAIN)[0].seq == 1  # nothing pruned
    result = run_cli("audit", "verify", "--full", db=db)
    assert result.code == 0, result.stderr
    assert check(engine, folder).intact  # unanchored files are left aside
    # The next run finishes the job (replacing what the killed one wrote).
    assert archived(engine, clock, folder) == OLD
    assert check(engine, folder).intact
    assert len(list(folder.glob("*.jsonl"))) == 1
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]


# -- the CLI -------------------------------------------------------------------------------


def test_the_cli_archives_and_refuses_bad_input_changing_nothing(
    site: tuple[Engine, ManualClock, Path], tmp_path: Path
) -> None:
    engine, _clock, folder = site
    db = tmp_path / "vortos.db"
    engine.close()
    for args, says in [
        (["--before", "yesterday-ish"], "neither an instant"),
        (["--before", "2999-01-01T00:00:00Z"], "in the future"),
        (["-o", str(db)], "is not a directory"),
    ]:
        result = run_cli("audit", "archive", *args, db=db)
        assert result.code == 2, result.stderr
        assert says in result.stderr
        assert "Traceback" not in result.stderr
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    result = run_cli("audit", "archive", "--before", "1d", "-o", str(foreign), db=db)
    assert result.code == 2
    assert "not this database's archive" in result.stderr
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    readonly = tmp_path / "readonly"
    readonly.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere
        result = run_cli("audit", "archive", "--before", "1d", "-o", str(readonly), db=db)
        assert result.code == 2
        assert "not writable" in result.stderr
    conn = apsw.Connection(str(db))
    assert conn.execute("SELECT count(*) FROM audit_entries").fetchall() == [(OLD + 2,)]
    conn.close()
    # Everything older than 1 day (T0's entries, a day before the database's newest).
    result = run_cli(
        "audit", "archive", "--before", "2026-01-05T12:00:00Z", "-o", str(folder), db=db
    )
    assert result.code == 0, result.stderr
    assert "entries 1..41 (41) archived" in result.stderr
    again = run_cli(
        "audit", "archive", "--before", "2026-01-05T12:00:00Z", "-o", str(folder), db=db
    )
    assert again.code == 0
    assert "nothing to archive" in again.stderr
    assert run_cli("audit", "verify", "--full", db=db).code == 0


# -- PostgreSQL ----------------------------------------------------------------------------


def test_archive_and_prune_through_the_postgresql_trigger(tmp_path: Path) -> None:
    with fresh_schema() as url:
        clock = ManualClock(T0)
        engine = pg_engine(url, clock)
        try:
            fill(engine, count=12)
            clock.advance(DAY_MS / 1000)
            engine.service.trigger("report", actor="bob")
            log = log_of(engine)
            # The trigger refuses a prune past the anchor...
            import psycopg  # noqa: PLC0415

            with psycopg.connect(url) as conn, pytest.raises(psycopg.Error):
                conn.execute("DELETE FROM audit_entries WHERE seq <= 3")
            report = archive(log, tmp_path / "a", before_ms=T0 + 1, now_ms=clock.now_ms())
            assert report.archived == 12
            assert [e.seq for e in log.entries(CHAIN)] == [13]
            assert check(engine, tmp_path / "a").intact
            # ...and past the anchor still, after it.
            with psycopg.connect(url) as conn, pytest.raises(psycopg.Error):
                conn.execute("DELETE FROM audit_entries WHERE seq = 13")
        finally:
            engine.close()
