"""Console: time to first frame and per-refresh cost of the Schedules and Live fires views.

Sizes: 1k schedules with 10k runs and 100k schedules with 1M runs (`--quick`: 1k/10k and
20k/200k). Target (at 100k): first frame under 1 s, refresh under 100 ms.

The console is the real one (`VortosConsole` over `open_read_model`), run headless with Textual's
Pilot at 160x48, refresh interval one hour so that only the benchmark's own refreshes happen.

- first frame: from creating the app to the view's table holding its first page, painted.
- refresh: one `await app.settle()` (the console re-reads the header's overview and the view's
  page and shows them) plus the paint that follows it. Painting is held back during the settle
  (`batch_update`) and then forced (`screen._on_timer_update()`, what Pilot does), so every
  sample pays its whole paint once. `settle()` checks every 5 ms, so a sample may include up to
  5 ms of waiting; the breakdown table separates the parts.
- read model alone: the same two reads (`overview` and the view's page) awaited straight on the
  read model, no UI; the UI overhead is refresh / read model alone.
- naive full load: every schedule through the sync service (`engine.service.schedules(limit=N)`),
  what a console without paging would read before showing anything.

The databases are built once with apsw straight into a file the engine created (rows from the
engine's codec) and cached under the temporary directory, keyed by size and schema.sql; `--rebuild`
builds them again. Their instants are relative to when they were built.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import io
import math
import pstats
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import apsw

from bench._common import (
    cores,
    machine_busy_s,
    new_database,
    now_ms,
    num,
    percentile,
    print_table,
    quiet_logging,
    verdict,
)
from engine import (
    Approval,
    AuditOverview,
    CronTrigger,
    FireListQuery,
    IntervalTrigger,
    Overview,
    Page,
    ReadModel,
    Run,
    RunDetail,
    ScheduleDetail,
    ScheduleListQuery,
    ScheduleOrigin,
    ScheduleRow,
    ScheduleSpec,
    SystemClock,
    open_engine,
    open_read_model,
)
from engine.backends.codec import RUN_COLUMNS, SCHEDULE_COLUMNS, schedule_values
from engine.backends.sql.read_model import DUE
from engine.backends.sqlite.connection import connect, schema_sql
from engine.backends.sqlite.read_model import _RECENT
from engine.domain.slots import slot_key
from engine.service.core import new_schedule
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.context import DEFAULT_PAGE, ConsoleContext
from vortos_tui.console.views.lists import ListView

SIZES = [(1_000, 10_000), (100_000, 1_000_000)]
QUICK_SIZES = [(1_000, 10_000), (20_000, 200_000)]
VIEWS = ("schedules", "fires")
REFRESHES, QUICK_REFRESHES = 40, 15
SCREEN = (160, 48)
FIRST_FRAME_TARGET_MS = 1000.0
REFRESH_TARGET_MS = 100.0
BUILD_FORMAT = "2"  # bump when the rows built here change
MINUTE_MS = 60_000
RUN_GAP_MS = 50  # slot instants of consecutive runs (1M runs span about 14 hours)
OPEN_FIRES = 50  # newest runs still dispatched or running

_S_COLUMNS = [c.strip() for c in SCHEDULE_COLUMNS.split(",")]
_S = {name: i for i, name in enumerate(_S_COLUMNS)}
_INSERT_SCHEDULE = (
    f"INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES ({', '.join('?' * len(_S_COLUMNS))})"
)
_R_COLUMNS = [c.strip() for c in RUN_COLUMNS.split(",")]
_INSERT_RUN = f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({', '.join('?' * len(_R_COLUMNS))})"
_FIRE_COLUMNS = (
    "run_id, tenant, schedule_id, slot_at, command, payload, available_at, created_at, attempts, "
    "lease_token, consumed_till, consumed_by, completed_at, discarded_at, last_error"
)


# -- building the databases -------------------------------------------------------------------


def _templates(now: int) -> list[list[Any]]:
    """Schedule rows of a few kinds (interval and cron), built by the service's own
    `new_schedule` and the codec; the builder replaces id, name, tenant, status and cursor."""
    specs = [
        ScheduleSpec(
            name="t-interval",
            trigger=IntervalTrigger(every_ms=10 * MINUTE_MS, anchor_ms=now),
            command="noop",
        ),
        ScheduleSpec(name="t-cron-15", trigger=CronTrigger("*/15 * * * *"), command="noop"),
        ScheduleSpec(
            name="t-cron-daily",
            trigger=CronTrigger("30 2 * * *"),
            command="noop",
            timezone="Europe/Berlin",
            payload={"report": "daily", "to": ["ops@example.com"]},
        ),
        ScheduleSpec(
            name="t-cron-weekdays",
            trigger=CronTrigger("0 9 * * 1-5"),
            command="noop",
            timezone="America/New_York",
            metadata={"team": "billing"},
        ),
    ]
    return [list(schedule_values(new_schedule(s, now, now, ScheduleOrigin.DYNAMIC))) for s in specs]


@dataclass(frozen=True, slots=True)
class Stored:
    id: str
    tenant: str
    name: str


def _schedule_rows(count: int, now: int, out: list[Stored]) -> Iterator[tuple[Any, ...]]:
    """`count` schedules: 95% active with their next fires spread over the next hour, 5% paused;
    one in ten in tenant `acme`, one in fifty sensitive. Appends each to `out`."""
    templates = _templates(now)
    for i in range(count):
        values = list(templates[i % len(templates)])
        sid = uuid.uuid4().hex
        tenant = "acme" if i % 10 == 7 else "default"
        name = f"job-{i:07d}-{('sync', 'report', 'cleanup', 'export')[i % 4]}"
        values[_S["id"]], values[_S["tenant"]], values[_S["name"]] = sid, tenant, name
        at = now + 1_000 + (i * 7_919) % count * (60 * MINUTE_MS) // count
        values[_S["next_slot_at"]] = values[_S["next_fire_at"]] = at
        if i % 20 == 13:
            values[_S["status"]] = "paused"
            values[_S["pause_note"]] = "paused by bench"
        values[_S["sensitive"]] = int(i % 50 == 11)
        out.append(Stored(sid, tenant, name))
        yield tuple(values)


def _state(i: int, newest: int) -> str:
    if newest - i < OPEN_FIRES:
        return "dispatched" if (newest - i) % 2 == 0 else "running"
    if i % 20 == 3:
        return "failed"
    if i % 211 == 5:
        return "dead_lettered"
    if i % 97 == 5:
        return "skipped"
    return "completed"


def _run_rows(
    count: int, schedules: Sequence[Stored], first_slot: int
) -> Iterator[tuple[Any, ...]]:
    """`count` runs, dispatch order = id order = slot order, spread round-robin over the
    schedules: mostly completed, 5% failed, some skipped and dead-lettered, the newest open."""
    newest = count - 1
    for i in range(count):
        s = schedules[(i * 7) % len(schedules)]
        slot = first_slot + i * RUN_GAP_MS
        state = _state(i, newest)
        started = None if state in ("dispatched", "skipped") else slot + 5 + i % 40
        finished = (
            None
            if started is None or state == "running"
            else started + 20 + (i * 13 + i // len(schedules) * 313) % 4_000
        )
        failed = state in ("failed", "dead_lettered")
        yield (
            i + 1,
            s.tenant,
            s.id,
            s.name,
            slot_key(s.id, slot, "UTC"),
            slot,
            slot,
            "manual" if i % 101 == 9 else "scheduled",
            state,
            slot + 2,
            "bench-node",
            0 if started is None else 1 + int(failed and i % 3 == 0),
            finished,
            "exit status 1" if failed else None,
            started,
            None if started is None else f"bench-consumer-{i % 4}",
            None if finished is None else int(failed),
            None,
            0,
        )


def _fire_rows(runs: int, keep: int, now: int) -> Iterator[tuple[Any, ...]]:
    """Per fire of the newest `keep` runs (retention removed the older ones): run id, lease
    token, lease end, holder, settled?, discarded?, last error; the rest comes from the run."""
    newest = runs - 1
    for i in range(max(0, runs - keep), runs):
        state = _state(i, newest)
        running = state == "running"
        done = state in ("completed", "failed", "skipped")
        yield (
            i + 1,
            "running" if running else None,
            now + 10 * MINUTE_MS if running else None,
            f"bench-consumer-{i % 4}" if running else None,
            1 if done else None,
            1 if state == "dead_lettered" else None,
            "exit status 1" if state in ("failed", "dead_lettered") else None,
        )


def build(path: Path, schedules: int, runs: int) -> None:
    """A database with `schedules` schedules and `runs` runs (and the newest 5% of the runs'
    fires), written in one transaction, then checkpointed into the main file."""
    new_database(path)
    now = now_ms()
    stored: list[Stored] = []
    conn = apsw.Connection(str(path))
    try:
        conn.execute("PRAGMA cache_size = -262144")
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(_INSERT_SCHEDULE, _schedule_rows(schedules, now, stored))
        first_slot = now - runs * RUN_GAP_MS - MINUTE_MS
        conn.executemany(_INSERT_RUN, _run_rows(runs, stored, first_slot))
        # Fires copy their run's tenant, schedule and slot; lease and settlement from the state.
        conn.executemany(
            f"INSERT INTO fire_queue ({_FIRE_COLUMNS}) "
            "SELECT r.id, r.tenant, r.schedule_id, r.slot_at, 'noop', '{}', r.slot_at, "
            "r.dispatched_at, r.attempts, ?2, ?3, ?4, "
            "CASE WHEN ?5 IS NULL THEN NULL ELSE coalesce(r.finished_at, r.dispatched_at) END, "
            "CASE WHEN ?6 IS NULL THEN NULL ELSE r.finished_at END, ?7 "
            "FROM runs r WHERE r.id = ?1",
            _fire_rows(runs, max(OPEN_FIRES, runs // 20), now),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def database(schedules: int, runs: int, *, rebuild: bool) -> tuple[Path, float | None]:
    """The cached database of this size (built first when missing); build seconds or None."""
    key = hashlib.sha256((schema_sql() + BUILD_FORMAT).encode()).hexdigest()[:10]
    folder = Path(tempfile.gettempdir()) / "vortos-bench-console"
    folder.mkdir(exist_ok=True)
    path = folder / f"console-{schedules}-{runs}-{key}.db"
    if path.exists() and not rebuild:
        return path, None
    for old in folder.glob(f"console-{schedules}-{runs}-*"):
        old.unlink()
    partial = folder / f"building-{schedules}-{runs}-{uuid.uuid4().hex[:8]}.db"
    started = time.perf_counter()
    try:
        build(partial, schedules, runs)
        for suffix in ("-wal", "-shm"):
            Path(f"{partial}{suffix}").unlink(missing_ok=True)
        partial.rename(path)
    finally:
        for leftover in folder.glob(f"{partial.name}*"):
            leftover.unlink()
    return path, time.perf_counter() - started


# -- the console, timed -----------------------------------------------------------------------


class TimedModel:
    """The read model, timing every call (seconds, appended to `spent`)."""

    def __init__(self, inner: ReadModel) -> None:
        self.inner = inner
        self.spent: list[float] = []

    async def _timed(self, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return await call()
        finally:
            self.spent.append(time.perf_counter() - started)

    async def overview(self, now_ms: int) -> Overview:
        found: Overview = await self._timed(lambda: self.inner.overview(now_ms))
        return found

    async def schedules(self, query: ScheduleListQuery) -> Page[ScheduleRow]:
        found: Page[ScheduleRow] = await self._timed(lambda: self.inner.schedules(query))
        return found

    async def fires(self, query: FireListQuery) -> Page[Run]:
        found: Page[Run] = await self._timed(lambda: self.inner.fires(query))
        return found

    async def schedule(self, schedule_id: str, *, runs: int = 20) -> ScheduleDetail | None:
        found: ScheduleDetail | None = await self._timed(
            lambda: self.inner.schedule(schedule_id, runs=runs)
        )
        return found

    async def run(self, run_id: int) -> RunDetail | None:
        found: RunDetail | None = await self._timed(lambda: self.inner.run(run_id))
        return found

    async def audit(self, chain: str | None = None, *, limit: int = 50) -> AuditOverview:
        result: AuditOverview = await self._timed(lambda: self.inner.audit(chain, limit=limit))
        return result

    async def approvals(self, *, limit: int = 100) -> list[Approval]:
        result: list[Approval] = await self._timed(lambda: self.inner.approvals(limit=limit))
        return result

    async def close(self) -> None:
        await self.inner.close()


class TimedConsole(VortosConsole):
    """The console, noting how long each refresh (read + show) took and whether one runs."""

    def __init__(self, ctx: ConsoleContext) -> None:
        super().__init__(ctx)
        self.busy = False
        self.spans: list[float] = []

    async def refresh_once(self) -> None:
        self.busy = True
        started = time.perf_counter()
        try:
            await super().refresh_once()
        finally:
            self.spans.append(time.perf_counter() - started)
            self.busy = False

    def idle(self) -> bool:
        """No refresh running and none asked for: the next settle() times a whole one."""
        return not self.busy and not (self._wake is not None and self._wake.is_set())


def _populated(app: TimedConsole, view: str) -> bool:
    screen = app.screen
    return (
        app.polls >= 1
        and app.current_mode == view
        and isinstance(screen, ListView)
        and screen.loaded
        and screen.table.row_count > 0
    )


async def _wait(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.perf_counter() + timeout
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError("the console did not get there in time")
        await asyncio.sleep(0.001)


@dataclass(slots=True)
class ConsoleFigures:
    first_frame_ms: float
    refresh_ms: list[float]  # settle + paint
    settle_ms: list[float]  # settle() alone
    paint_ms: list[float]
    read_ms: list[float]  # the refresh's reads, timed at the read model inside the app
    span_ms: list[float]  # refresh_once: read + show
    rows: int
    switch_ms: float  # Schedules -> Live fires, until its first page is painted (schedules run)
    profile: str


def _context(db: Path, view: str, inner: ReadModel | None) -> tuple[ConsoleContext, TimedModel]:
    model = TimedModel(open_read_model(db) if inner is None else inner)
    ctx = ConsoleContext(
        db_label=db.name,
        model=model,
        clock=SystemClock(),
        zone=ZoneInfo("UTC"),
        operator="bench",
        actions=None,
        refresh_s=3600,
        start_view=view,
    )
    return ctx, model


async def measure_console(
    db: Path, view: str, refreshes: int, *, profile: bool, model: ReadModel | None = None
) -> ConsoleFigures:
    """The console on `db` (its own read model, or `model`: bench/control_reads.py passes the
    one over the control socket)."""
    ctx, timed = _context(db, view, model)
    started = time.perf_counter()
    app = TimedConsole(ctx)
    async with app.run_test(size=SCREEN) as pilot:
        await _wait(lambda: _populated(app, view))
        app.screen._on_timer_update()  # paint what the first read put on the screen
        first = time.perf_counter() - started
        await pilot.pause()
        figures = ConsoleFigures(1000 * first, [], [], [], [], [], 0, math.nan, "")
        screen = app.screen
        assert isinstance(screen, ListView)
        figures.rows = screen.table.row_count
        # The first is a warm-up; with `profile`, one more is profiled and not counted.
        for i in range(refreshes + 1 + int(profile)):
            await _wait(app.idle)
            reads, spans = len(timed.spent), len(app.spans)
            profiler = cProfile.Profile() if i > refreshes else None
            t0 = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            with app.batch_update():
                await app.settle()
            t1 = time.perf_counter()
            app.screen._on_timer_update()
            t2 = time.perf_counter()
            if profiler is not None:
                profiler.disable()
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(
                    "cumulative"
                ).print_stats(35)
                figures.profile = out.getvalue()
                continue
            if i == 0:
                continue
            figures.settle_ms.append(1000 * (t1 - t0))
            figures.paint_ms.append(1000 * (t2 - t1))
            figures.refresh_ms.append(1000 * (t2 - t0))
            figures.read_ms.append(1000 * sum(timed.spent[reads:]))
            figures.span_ms.append(1000 * sum(app.spans[spans:]))
        if view == "schedules":
            await _wait(app.idle)
            t0 = time.perf_counter()
            app.switch_view("fires")
            await _wait(lambda: _populated(app, "fires"))
            app.screen._on_timer_update()
            figures.switch_ms = 1000 * (time.perf_counter() - t0)
    return figures


async def read_model_alone(db: Path, view: str, count: int) -> tuple[list[float], list[float]]:
    """The refresh's two reads straight on the read model: (overview + page, page alone) ms."""
    model = open_read_model(db)
    clock = SystemClock()
    both, page = [], []
    for i in range(count + 1):
        t0 = time.perf_counter()
        await model.overview(clock.now_ms())
        t1 = time.perf_counter()
        if view == "schedules":
            await model.schedules(ScheduleListQuery(limit=DEFAULT_PAGE))
        else:
            await model.fires(FireListQuery(limit=DEFAULT_PAGE))
        t2 = time.perf_counter()
        if i:
            both.append(1000 * (t2 - t0))
            page.append(1000 * (t2 - t1))
    await model.close()
    return both, page


def naive_full_load(db: Path, schedules: int, repeats: int) -> float:
    """Best of `repeats`: every schedule through the sync service, ms."""
    engine = open_engine(db)
    try:
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            found = engine.service.schedules(limit=schedules)
            best = min(best, time.perf_counter() - t0)
            assert len(found) == schedules, (len(found), schedules)
        return 1000 * best
    finally:
        engine.close()


QUERIES = {
    "overview: schedules, all": "SELECT count(*) FROM schedules",
    "overview: schedules not active": "SELECT status, count(*) FROM schedules "
    "WHERE status <> 'active' GROUP BY status",
    "overview: open fires": "SELECT count(*) FROM fire_queue "
    "WHERE completed_at IS NULL AND discarded_at IS NULL",
    "overview: dead letters": "SELECT count(*) FROM fire_queue WHERE discarded_at IS NOT NULL",
    "schedules: count(*)": "SELECT count(*) FROM schedules WHERE true",
    "schedules: count due": f"SELECT count(*) FROM schedules WHERE {DUE}",
    f"schedules: page of {DEFAULT_PAGE}, with recent runs": f"SELECT {SCHEDULE_COLUMNS}, {_RECENT} "
    f"FROM schedules WHERE {DUE} ORDER BY next_fire_at LIMIT {DEFAULT_PAGE} OFFSET 0",
    f"fires: page of {DEFAULT_PAGE}": f"SELECT {RUN_COLUMNS} FROM runs ORDER BY id DESC "
    f"LIMIT {DEFAULT_PAGE + 1} OFFSET 0",
}


def query_costs(db: Path, count: int) -> list[tuple[str, float, float]]:
    """Each query of a refresh, median ms: on one connection kept open (SQLite's page cache
    warm) and on a fresh connection, as the read model opens one per call (cold page cache,
    the file in the OS cache)."""
    out = []
    warm = connect(db, readonly=True)
    try:
        for label, query in [("open a connection + BEGIN", ""), *QUERIES.items()]:
            kept, fresh = [], []
            for _ in range(count):
                if query:
                    t0 = time.perf_counter()
                    list(warm.execute(query))
                    kept.append(1000 * (time.perf_counter() - t0))
                t0 = time.perf_counter()
                conn = connect(db, readonly=True)
                conn.execute("BEGIN")
                t1 = time.perf_counter()
                if query:
                    list(conn.execute(query))
                t2 = time.perf_counter()
                conn.close()
                fresh.append(1000 * ((t2 - t1) if query else (t1 - t0)))
            out.append(
                (label, statistics.median(kept) if kept else math.nan, statistics.median(fresh))
            )
    finally:
        warm.close()
    return out


# -- the run ------------------------------------------------------------------------------------


def ms(values: Sequence[float], pct: float = 50) -> float:
    return percentile(values, pct) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1k/10k and 20k/200k, fewer samples")
    parser.add_argument("--rebuild", action="store_true", help="build the cached databases again")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile one refresh of each view at the top size"
    )
    args = parser.parse_args()
    quiet_logging()
    sizes = QUICK_SIZES if args.quick else SIZES
    refreshes = QUICK_REFRESHES if args.quick else REFRESHES
    busy0, cpu0, wall0 = machine_busy_s(), time.process_time(), time.perf_counter()

    rows: list[list[object]] = []
    parts: list[list[object]] = []
    builds: list[list[object]] = []
    reads: list[list[object]] = []
    profiles: list[tuple[str, str]] = []
    for schedules, runs in sizes:
        db, build_s = database(schedules, runs, rebuild=args.rebuild)
        label = f"{num(schedules)} / {num(runs)}"
        builds.append(
            [
                label,
                "cached" if build_s is None else num(build_s, 1),
                num(db.stat().st_size / 2**20, 0),
                str(db),
            ]
        )
        naive = naive_full_load(db, schedules, 3 if schedules <= 20_000 else 2)
        top = (schedules, runs) == sizes[-1]
        for view in VIEWS:
            figures = asyncio.run(
                measure_console(db, view, refreshes, profile=args.profile and top)
            )
            alone, page = asyncio.run(read_model_alone(db, view, refreshes))
            p50, p95 = ms(figures.refresh_ms), ms(figures.refresh_ms, 95)
            ok = figures.first_frame_ms < FIRST_FRAME_TARGET_MS and p50 < REFRESH_TARGET_MS
            rows.append(
                [
                    label,
                    "Schedules" if view == "schedules" else "Live fires",
                    num(figures.first_frame_ms, 0),
                    num(p50),
                    num(p95),
                    num(ms(alone)),
                    f"{p50 / ms(alone):.1f}x",
                    num(naive, 0) if view == "schedules" else "",
                    f"{verdict(ok)}" + ("" if p95 < REFRESH_TARGET_MS else " (p95 over)"),
                ]
            )
            show = [s - r for s, r in zip(figures.span_ms, figures.read_ms, strict=True)]
            rest = [w - s for w, s in zip(figures.settle_ms, figures.span_ms, strict=True)]
            parts.append(
                [
                    label,
                    "Schedules" if view == "schedules" else "Live fires",
                    num(figures.rows),
                    num(ms(figures.read_ms)),
                    num(ms(page)),
                    num(ms(show)),
                    num(ms(figures.paint_ms)),
                    num(ms(rest)),
                    num(figures.switch_ms, 0) if view == "schedules" else "",
                ]
            )
            if figures.profile:
                profiles.append((f"{label}, {view}", figures.profile))
        reads += [[label, q, num(kept, 2), num(fresh, 2)] for q, kept, fresh in query_costs(db, 9)]

    print_table(
        f"Console at {SCREEN[0]}x{SCREEN[1]}, headless (Pilot); {refreshes} refreshes per view; "
        f"page {DEFAULT_PAGE} rows; targets: first frame < {FIRST_FRAME_TARGET_MS:.0f} ms, "
        f"refresh < {REFRESH_TARGET_MS:.0f} ms (p50)",
        [
            "schedules / runs",
            "view",
            "first frame ms",
            "refresh p50 ms",
            "refresh p95 ms",
            "read model alone p50 ms",
            "UI overhead",
            "naive full load ms",
            "verdict",
        ],
        rows,
    )
    print_table(
        "Where a refresh goes, p50 ms: read (overview + page, timed inside the app), the page "
        "read alone outside it, show (rows into the table), paint, the rest of settle() "
        "(message handling and its 5 ms poll); switch = Schedules -> Live fires, painted",
        [
            "schedules / runs",
            "view",
            "rows shown",
            "read in app",
            "page read alone",
            "show",
            "paint",
            "rest",
            "switch ms",
        ],
        parts,
    )
    print_table(
        "A refresh's queries one by one, median ms: on a connection kept open, and on a fresh "
        "connection as the read model opens one per call (SQLite's page cache cold)",
        ["schedules / runs", "query", "kept connection", "fresh connection"],
        reads,
    )
    print_table(
        "Databases (cached under the temporary directory; --rebuild builds again)",
        ["schedules / runs", "build s", "file MiB", "path"],
        builds,
    )
    wall = time.perf_counter() - wall0
    other = machine_busy_s() - busy0 - (time.process_time() - cpu0)
    print(
        f"{cores()} cores; other processes used {other / wall:.2f} cores on average over "
        f"{wall:.0f} s (this process: {(time.process_time() - cpu0) / wall:.2f})"
    )
    for title, text in profiles:
        print(f"\ncProfile of one refresh ({title}), main thread only, top 35 cumulative:")
        print(text)


if __name__ == "__main__":
    main()
