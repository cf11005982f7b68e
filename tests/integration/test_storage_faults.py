"""`vortos run` when its SQLite file reads wrong: a moment of it is retried, a lasting one ends
the service with one line and exit code 1 (so systemd restarts it, and says why).

The fault is real and deterministic: the test overwrites the file's 16-byte SQLite header (what
SQLite checks whenever it reads page 1 afresh, after another connection's commit), holding it
wrong until the service has met it, then puts the constant header back. Every connection that
reads the file then gets SQLITE_NOTADB, as the report's transient "file is not a database" did.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from engine.backends.sqlite.connection import SQLITE_HEADER, ConnectionPool
from engine.domain.errors import DatabaseUnreadable
from tests.conftest import run_cli
from tests.integration.processes import Daemon, wait_for

GARBAGE = b"not-sqlite-now!!"


@contextmanager
def unreadable(db: Path) -> Iterator[None]:
    """The file's header is wrong until the block ends. Written again every few milliseconds:
    the service's background checkpoint may copy a good page 1 back from the WAL."""
    assert len(GARBAGE) == len(SQLITE_HEADER)
    done = threading.Event()

    def spoil() -> None:
        with db.open("r+b", buffering=0) as handle:
            while not done.is_set():
                handle.seek(0)
                handle.write(GARBAGE)
                done.wait(0.005)
            handle.seek(0)
            handle.write(SQLITE_HEADER)

    spoiler = threading.Thread(target=spoil, name="spoil-header")
    spoiler.start()
    try:
        yield
    finally:
        done.set()
        spoiler.join()


def _checkpoint_wal_away(db: Path) -> None:
    """Copy the WAL into the file and empty it (retrying while a reader holds it)."""
    with closing(sqlite3.connect(db, timeout=30)) as conn:
        deadline = time.monotonic() + 60
        while conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] != 0:
            assert time.monotonic() < deadline, "the WAL could not be checkpointed"


def _ticking(db: Path) -> None:
    for name in ("t1", "t2", "t3"):
        added = run_cli("schedule", "add", name, "--every", "1s", "--command", "noop", db=db)
        assert added.code == 0, added.stderr


def _completed(daemon: Daemon) -> int:
    return daemon.log.count(": completed")


def _failures(daemon: Daemon, loop: str) -> int:
    return daemon.log.count(f"vortos.{loop}: storage error: cannot use database")


def test_a_moment_of_an_unreadable_file_is_retried_and_the_service_keeps_running(
    tmp_path: Path,
) -> None:
    """Promise: a transient storage error in the daemon's loop or the consumer's (claim,
    settle, or the wait between) is logged and retried with backoff; it never ends `vortos
    run`, and fires run again once the file reads right.

    The process under test stands by (its daemon loop retries the lease) and consumes; a
    leader that only dispatches beside it keeps committing, so its connections read page 1
    afresh and meet the bad header."""
    db = tmp_path / "vortos.db"
    _ticking(db)
    leader = Daemon(db, "leader", tmp_path, args=["--no-consume"])
    wait_for(lambda: "leader leads" in leader.log, 60, "the leader to lead")
    service = Daemon(db, "service", tmp_path)
    try:
        wait_for(lambda: _completed(service) >= 3, 60, "the service to run fires")
        # A connection meets a bad header only when it reads page 1 from the file; while the
        # leader commits, page 1 is mostly in the WAL, and the checkpoint that would move it
        # back fails on the bad header. So: the leader dies (its lease holds for the TTL), the
        # WAL is checkpointed away, and then the header goes bad.
        leader.kill()
        _checkpoint_wal_away(db)
        with unreadable(db):
            # A loop failed, backed off, and failed again: it outlived a failure. Which loop
            # meets the bad header first depends on who reads page 1 from the file rather
            # than the WAL; the fault is lifted as soon as one has retried, well before the
            # service's limit for a lasting fault (6 failures in a row) could end it.
            try:
                wait_for(
                    lambda: (
                        _failures(service, "daemon") >= 2 or _failures(service, "consumer") >= 2
                    ),
                    120,
                    "a loop to retry the unreadable file",
                )
            except AssertionError as timed_out:
                raise AssertionError(f"{timed_out}; log:\n{service.log[-3000:]}") from None
        before = _completed(service)
        wait_for(
            lambda: _completed(service) >= before + 3,
            60,
            f"fires to run again after the file reads right; log:\n{service.log[-3000:]}",
        )
        assert service.process.poll() is None, service.log[-3000:]
        assert "Traceback" not in service.log
    finally:
        leader.terminate()
        assert service.terminate() == 0, service.log[-3000:]


def test_a_file_that_stays_unreadable_ends_the_service_with_one_line_and_exit_1(
    tmp_path: Path,
) -> None:
    """Promise: when the file stays unreadable try after try (truly corrupt), `vortos run`
    stops after a bounded number of retries, with one line saying what and why, and exit
    code 1, so the service manager restarts it."""
    db = tmp_path / "vortos.db"
    _ticking(db)
    service = Daemon(db, "service", tmp_path)
    try:
        wait_for(lambda: _completed(service) >= 3, 60, "the service to run fires")
        with unreadable(db):
            wait_for(lambda: service.process.poll() is not None, 120, "the service to stop")
    finally:
        if service.process.poll() is None:
            service.kill()
    log = service.log
    assert service.process.returncode == 1, log[-3000:]
    assert "(retrying in " in log  # it was retried before it gave up
    last = log.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot use database {db}: it is not a SQLite database"), last
    assert "in a row" in last, last
    assert last.endswith("stopping)"), last
    assert "Traceback" not in log


def test_a_pool_connection_that_met_a_bad_header_is_renewed_once_the_file_reads_right(
    tmp_path: Path,
) -> None:
    """SQLite keeps a connection that read a bad header failing with 'not a database' even
    after the header is right again; the pool closes it, so the next read opens a fresh one
    (without that, a moment of a bad header ended `vortos run` six failures later)."""
    db = tmp_path / "vortos.db"
    _ticking(db)
    pool = ConnectionPool(db)
    try:
        assert pool.read("SELECT count(*) FROM schedules") == [(3,)]
        _checkpoint_wal_away(db)
        with db.open("r+b", buffering=0) as handle:
            handle.write(GARBAGE)
            with pytest.raises(DatabaseUnreadable):
                pool.read("SELECT count(*) FROM schedules")
            handle.seek(0)
            handle.write(SQLITE_HEADER)
        assert pool.read("SELECT count(*) FROM schedules") == [(3,)]
    finally:
        pool.close()
