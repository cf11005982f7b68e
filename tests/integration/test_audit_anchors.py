"""External anchors (engine.governance.anchors): `vortos audit anchor` appends signed heads to
a 0600 append-only file; a verification given it catches a truncated tail and a rewritten
one, and an edited line; the doctor's audit.anchor_age warns when anchoring stopped."""

from __future__ import annotations

import json
from pathlib import Path

import apsw

from engine import ManualClock, open_engine
from engine.backends.sql.audit import SqlAuditLog
from engine.domain.timeutil import DAY_MS, HOUR_MS
from engine.governance.anchor_checks import AnchorAge
from engine.governance.archive import archive, verify_with_archive
from engine.governance.doctor import DoctorContext, Status
from tests.conftest import T0, run_cli
from tests.integration.test_audit_archive import CHAIN, OLD, fill, log_of, public_key


def _drop_tail(db: Path, after: int) -> None:
    """What someone with the file does to hide the newest entries."""
    conn = apsw.Connection(str(db))
    conn.execute("DROP TRIGGER IF EXISTS audit_entries_no_delete")
    conn.execute("DELETE FROM audit_entries WHERE chain = ? AND seq > ?", (CHAIN, after))
    conn.execute("DELETE FROM audit_checkpoints WHERE chain = ? AND seq > ?", (CHAIN, after))
    conn.close()


def test_the_cli_appends_signed_heads_to_a_private_file(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        fill(engine)
    for _ in range(2):
        result = run_cli("audit", "anchor", db=db)
        assert result.code == 0, result.stderr
    path = tmp_path / "vortos.db.anchors.jsonl"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    assert set(lines[0]) == {"database_id", "chain", "seq", "hash", "key_id", "at", "signature"}
    assert lines[0]["chain"] == CHAIN
    assert lines[0]["seq"] == OLD


def test_a_truncated_or_rewritten_tail_is_caught_by_the_anchors(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    anchors = tmp_path / "vortos.db.anchors.jsonl"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        fill(engine)
    assert run_cli("audit", "anchor", db=db).code == 0
    with open_engine(db, clock=ManualClock(T0)) as engine:
        log = log_of(engine)
        intact = verify_with_archive(
            None, log=log, public_key=public_key(engine), anchors_file=anchors
        )
        # Public key only: the signed head vouches for every entry up to it.
        assert intact.intact, intact.to_json()
        assert intact.chains[0].anchored_externally == 1
    _drop_tail(db, OLD - 3)
    with open_engine(db, clock=ManualClock(T0)) as engine:
        found = verify_with_archive(
            None, log=log_of(engine), keys=log_of(engine).keys(), anchors_file=anchors
        )
        assert not found.intact
        reason = found.chains[0].problem.reason  # type: ignore[union-attr]
        assert f"anchored at entry {OLD}" in reason
        assert "truncated" in reason
        # Written again past the cut: the entry at the anchored seq is another one.
        for _ in range(5):
            engine.service.trigger("report", actor="mallory")
        found = verify_with_archive(
            None, log=log_of(engine), keys=log_of(engine).keys(), anchors_file=anchors
        )
        assert "differs from the head anchored externally" in found.chains[0].problem.reason  # type: ignore[union-attr]


def test_an_edited_anchor_line_is_named(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    anchors = tmp_path / "vortos.db.anchors.jsonl"
    with open_engine(db, clock=ManualClock(T0)) as engine:
        fill(engine)
    assert run_cli("audit", "anchor", db=db).code == 0
    line = json.loads(anchors.read_text())
    line["seq"] = OLD - 5
    anchors.write_text(json.dumps(line) + "\n")
    with open_engine(db, clock=ManualClock(T0)) as engine:
        found = verify_with_archive(
            None, log=log_of(engine), keys=log_of(engine).keys(), anchors_file=anchors
        )
    assert not found.intact
    assert "line 1 (chain tenant:default, entry 36) is not validly signed" in found.problems[0]


def test_anchors_and_archive_together(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    db = tmp_path / "vortos.db"
    with open_engine(db, clock=clock) as engine:
        fill(engine)
        clock.advance(DAY_MS / 1000)
        engine.service.trigger("report", actor="bob")
        log: SqlAuditLog = log_of(engine)  # type: ignore[type-arg]
        from engine.retention.audit_upkeep import anchor_heads  # noqa: PLC0415

        anchors = tmp_path / "a.jsonl"
        anchor_heads(engine.storage, clock, anchors)  # head OLD + 1, before archiving
        archive(log, tmp_path / "archive", before_ms=T0 + 1, now_ms=clock.now_ms())
        engine.service.trigger("report", actor="bob")
        anchor_heads(engine.storage, clock, anchors)
        result = verify_with_archive(
            tmp_path / "archive", log=log, public_key=public_key(engine), anchors_file=anchors
        )
        assert result.intact, result.to_json()
        assert result.chains[0].anchored_externally == 2


def _age(tmp_path: Path, clock: ManualClock, engine: object) -> tuple[Status, str]:
    ctx = DoctorContext(engine.storage, clock, tmp_path / "vortos.db")  # type: ignore[attr-defined]
    finding = AnchorAge().run(ctx)
    return finding.status, finding.summary


def test_the_doctor_warns_when_anchoring_stopped(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with open_engine(tmp_path / "vortos.db", clock=clock) as engine:
        assert _age(tmp_path, clock, engine)[0] is Status.PASS  # nothing to anchor yet
        fill(engine)
        status, summary = _age(tmp_path, clock, engine)
        assert status is Status.WARN
        assert "never been anchored" in summary
        from engine.retention.audit_upkeep import anchor_heads  # noqa: PLC0415

        anchor_heads(engine.storage, clock, tmp_path / "vortos.db.anchors.jsonl")
        clock.advance(HOUR_MS / 1000)
        assert _age(tmp_path, clock, engine)[0] is Status.PASS
        clock.advance(HOUR_MS / 1000 + 1)
        status, summary = _age(tmp_path, clock, engine)
        assert status is Status.WARN
        assert "the newest anchor is 2h" in summary
