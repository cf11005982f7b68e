"""What the benchmarks share: statistics, tables, memory, machine load, scratch databases.

Big setups insert schedule rows straight into the file in one transaction (one service call per
schedule would be one transaction each); the rows are built by the engine's own codec, and the
engine under test is always the real one, opened on that file.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from engine import (
    IntervalTrigger,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleStatus,
    open_engine,
)
from engine.backends.codec import SCHEDULE_COLUMNS, schedule_values
from engine.domain.schedule import canonical_json

_COLUMNS = [c.strip() for c in SCHEDULE_COLUMNS.split(",")]
_ID, _NAME = _COLUMNS.index("id"), _COLUMNS.index("name")
_INSERT = f"INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES ({', '.join('?' * len(_COLUMNS))})"

# -- command line, logging ------------------------------------------------------------------


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a smaller, shorter run")
    return parser.parse_args(argv)


def quiet_logging() -> None:
    """The daemon logs a line per fire at INFO: far too much for a benchmark."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("vortos").setLevel(logging.WARNING)


# -- statistics and tables ------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of `values` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Spread:
    count: int
    p50: float
    p99: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread:
        ordered = sorted(values)
        top = ordered[-1] if ordered else math.nan
        return Spread(len(ordered), percentile(ordered, 50), percentile(ordered, 99), top)


def num(value: int | float, digits: int = 1) -> str:
    """A number for a table: thousands separated, `-` for NaN."""
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain text table: first column left-aligned, the rest right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    print(f"\n{title}")
    print(line(cells[0]))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print(line(row))
    print(flush=True)


# -- memory ---------------------------------------------------------------------------------


def peak_rss_mib() -> float:
    """This process's peak resident set (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    """This process's resident set now, from /proc (NaN where there is no /proc)."""
    try:
        for text in Path("/proc/self/status").read_text().splitlines():
            if text.startswith("VmRSS:"):
                return int(text.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def machine_busy_s() -> float:
    """CPU seconds every process on the machine has used since boot (NaN without /proc).

    The benchmarks subtract their own CPU time from the change in this over a run to show how
    busy the rest of the machine was: other work on these two cores skews every figure here.
    """
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return math.nan
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def cores() -> int:
    return os.cpu_count() or 1


# -- scratch databases ----------------------------------------------------------------------


@contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="vortos-bench-") as name:
        yield Path(name)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_database(path: Path) -> Path:
    """A fresh Vortos database file, created by the engine itself."""
    open_engine(path).close()
    return path


@contextmanager
def pg_schema(base_url: str) -> Iterator[str]:
    """A URL whose search_path is a new schema `vortos_bench_<hex>` of the PostgreSQL database
    at `base_url`, with the Vortos tables created by the engine's own migration; the schema is
    dropped afterwards (as tests/pg.py's fresh_schema: sessions still in it are ended first).
    Needs psycopg (the `postgres` extra)."""
    import psycopg  # noqa: PLC0415 - the postgres extra, only when a benchmark asks for it

    from engine.backends.postgres import migrate_database  # noqa: PLC0415

    schema = f"vortos_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in base_url else "?"
    url = f"{base_url}{separator}options=-csearch_path%3D{schema}"
    try:
        migrate_database(url)
        yield url
    finally:
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND datname = current_database() "
                "AND query LIKE %s",
                (f"%{schema}%",),
            )
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def interval_rows(
    count: int,
    *,
    every_ms: int,
    anchor_ms: int,
    prefix: str,
    cursor_ms: int | None = None,
    misfire: MisfirePolicy | None = None,
) -> Iterator[tuple[Any, ...]]:
    """Rows of `count` active interval schedules running `noop`, all on one anchor.

    `cursor_ms` (default: the anchor) is the first slot not yet dispatched.
    """
    cursor = anchor_ms if cursor_ms is None else cursor_ms
    created = now_ms()
    template = Schedule(
        id="template",
        tenant="default",
        name="template",
        trigger=IntervalTrigger(every_ms=every_ms, anchor_ms=anchor_ms),
        timezone="UTC",
        command="noop",
        payload={},
        misfire=misfire or MisfirePolicy(),
        overlap=OverlapPolicy.SKIP,
        jitter_ms=0,
        status=ScheduleStatus.ACTIVE,
        sensitive=False,
        metadata={},
        version=1,
        next_slot_at=cursor,
        next_fire_at=cursor,
        created_at=created,
        updated_at=created,
    )
    values = list(schedule_values(template))
    for i in range(count):
        values[_ID] = uuid.uuid4().hex
        values[_NAME] = f"{prefix}-{i:07d}"
        yield tuple(values)


def bulk_insert(path: Path, rows: Iterable[tuple[Any, ...]]) -> None:
    """Insert schedule rows in one transaction."""
    conn = apsw.Connection(str(path))
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(_INSERT, rows)
        conn.execute("COMMIT")
    finally:
        conn.close()


def reanchor(path: Path, *, every_ms: int, first_ms: int, spread_ms: int = 0) -> None:
    """Put every interval schedule's first slot at `first_ms`, or spread the first slots evenly
    over `[first_ms, first_ms + spread_ms)`, the cursor on that slot (setup only)."""
    conn = apsw.Connection(str(path))
    try:
        conn.execute("BEGIN IMMEDIATE")
        ids = [r[0] for r in conn.execute("SELECT id FROM schedules ORDER BY rowid")]
        changes = []
        for i, sid in enumerate(ids):
            anchor = first_ms + i * spread_ms // max(1, len(ids))
            spec = canonical_json(IntervalTrigger(every_ms=every_ms, anchor_ms=anchor).to_spec())
            changes.append((spec, anchor, anchor, sid))
        conn.executemany(
            "UPDATE schedules SET trigger_spec = ?, next_slot_at = ?, next_fire_at = ? "
            "WHERE id = ?",
            changes,
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def count_of(conn: apsw.Connection, sql: str, args: tuple[Any, ...] = ()) -> int:
    """The integer a `SELECT count(...)` query returns."""
    value = conn.execute(sql, args).fetchall()[0][0]
    if not isinstance(value, int):
        raise TypeError(f"expected an integer from {sql!r}, got {value!r}")
    return value


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def run_child(script: str, args: Sequence[str], what: str) -> dict[str, Any]:
    """Run `script` in a fresh Python process and return the JSON object it prints last; its
    own process keeps its memory and CPU figures apart from ours."""
    done = subprocess.run(
        [sys.executable, str(Path(script).resolve()), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise RuntimeError(f"{what} failed (exit {done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def apscheduler_on_sqlite(folder: Path) -> tuple[Any, Any]:
    """An APScheduler 3.11 BackgroundScheduler (UTC) whose job store is a SQLite file in
    `folder`, tuned as Vortos's file is (WAL, synchronous=NORMAL), and the SQLAlchemy engine to
    dispose of afterwards. Benchmark-only: APScheduler and SQLAlchemy are imported here, when a
    benchmark asks for them."""
    import sqlite3  # noqa: PLC0415
    from datetime import UTC  # noqa: PLC0415

    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore  # noqa: PLC0415
    from apscheduler.schedulers.background import BackgroundScheduler  # noqa: PLC0415
    from sqlalchemy import create_engine, event  # noqa: PLC0415

    db = folder / "apscheduler.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
    store = create_engine(f"sqlite:///{db}")

    def pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA synchronous = NORMAL")

    event.listen(store, "connect", pragmas)
    scheduler = BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(engine=store)}, timezone=UTC
    )
    return scheduler, store
