"""Issue 16 on PostgreSQL, from outside: three hosts running `vortos db migrate` at once, each
with an audit key file of its own, end with one key accepted and the other two refused (exit
2, naming both fingerprints); a run row of a past dispatch edited in the database is found by
`vortos audit verify --full`. Needs the test server (VORTOS_TEST_REQUIRE_SERVERS=1 makes its
absence a failure, as in CI)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec
from engine.domain.timeutil import MINUTE_MS
from engine.governance.keys import load_keyring
from tests.conftest import T0, cli_env, run_cli
from tests.pg import PG_URL, fresh_schema, pg_engine, pg_env


@pytest.fixture
def empty_schema() -> Iterator[str]:
    with fresh_schema(migrated=False) as url:
        yield url


@pytest.fixture
def migrated() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


def test_three_concurrent_migrates_with_three_keys_accept_exactly_one(
    empty_schema: str, tmp_path: Path
) -> None:
    key_files = [tmp_path / f"host-{n}.audit-key" for n in range(3)]
    command = [sys.executable, "-m", "vortos_tui.cli", "--db", empty_schema, "db", "migrate"]
    racers = [
        subprocess.Popen(
            command,
            env=cli_env({"VORTOS_AUDIT_KEY_FILE": str(key_file)}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for key_file in key_files
    ]
    said = [racer.communicate(timeout=120) for racer in racers]
    codes = [racer.returncode for racer in racers]
    fingerprints = [
        load_keyring(empty_schema, key_file=k, create=False).active_id for k in key_files
    ]
    assert len(set(fingerprints)) == 3, "each host made a key of its own"
    assert sorted(codes) == [0, 2, 2], (codes, said)
    winner = fingerprints[codes.index(0)]
    for code, (_out, err), ours in zip(codes, said, fingerprints, strict=True):
        assert "Traceback" not in err
        if code == 2:
            assert ours in err, err  # this host's key
            assert winner in err, err  # and the database's
    # The database's key is the winner's, and only it may write from now on.
    for key_file, ours in zip(key_files, fingerprints, strict=True):
        added = run_cli(
            "--db",
            empty_schema,
            "schedule",
            "add",
            f"job-{ours}",
            "--every",
            "1h",
            "--command",
            "noop",
            env={"VORTOS_AUDIT_KEY_FILE": str(key_file)},
        )
        assert "Traceback" not in added.stderr
        if ours == winner:
            assert added.code == 0, added.stderr
        else:
            assert added.code == 2, added.stderr
            assert ours in added.stderr
            assert winner in added.stderr


def test_a_run_row_of_a_past_dispatch_edited_on_postgres_is_found(migrated: str) -> None:
    clock = ManualClock(T0)
    engine = pg_engine(migrated, clock)
    try:
        for name in ("alpha", "beta", "gamma"):
            engine.service.create(
                ScheduleSpec(name, IntervalTrigger(MINUTE_MS, T0 + MINUTE_MS), "noop"),
                actor="alice",
            )
        daemon = engine.daemon(node_id="node-1", lease_ttl_ms=3_600_000, lookahead_ms=0)
        daemon.step()
        for _ in range(3):
            clock.advance(60)
            daemon.step()
        daemon.release()
    finally:
        engine.close()
    intact = run_cli("--db", migrated, "audit", "verify", "--full", env=pg_env())
    assert intact.code == 0, intact.stdout + intact.stderr
    assert "3 dispatch batch(es) matched" in intact.stderr
    schema = migrated.rsplit("%3D", 1)[1]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        # The second dispatch batch, and the first run it committed to.
        batch = conn.execute(
            f"SELECT seq, data FROM {schema}.audit_entries WHERE event = 'fires.dispatched' "
            "ORDER BY seq OFFSET 1 LIMIT 1"
        ).fetchone()
        assert batch is not None
        data = batch[1] if isinstance(batch[1], dict) else json.loads(batch[1])
        run_id = int(data["runs"][0][0])
        conn.execute(
            f"UPDATE {schema}.runs SET slot_key = slot_key || 'x' WHERE id = %s", (run_id,)
        )
    result = run_cli("--db", migrated, "audit", "verify", "--full", env=pg_env())
    said = result.stdout + result.stderr
    assert "Traceback" not in said
    assert result.code == 1, said
    assert f"audit chain tenant:default is broken at entry {batch[0]}:" in result.stderr, said
    assert "run rows of this dispatch batch were edited" in result.stderr, said
