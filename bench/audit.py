"""What the audit chain costs: per fire dispatched, and to verify.

1. Dispatch with audit on and off: the backlogs of `throughput.py` (one due slot on each of N
   schedules; N/100 schedules 100 slots behind, misfire `each`), 100,000 due slots (`--quick`:
   10,000), drained by the real daemon on a frozen manual clock. Every fire is audited (there is
   no setting to turn it off), so "off" replaces the dispatcher's `append_in` (seal the
   `fire.dispatched` entries and insert them, inside the dispatch transaction) with a function
   that does nothing, for this benchmark only; the `AuditEvent`s are still built. Both modes in
   one process on copies of one backlog file, alternating which goes first, several times.
2. Where an entry's cost goes: `seal()` in a loop and its parts (encoding `data` to canonical
   JSON happens once, in the content hash; the row stores that text), and `append_in` alone for
   batches of 2,000 events (the daemon's batch) in a transaction of their own.
3. Verify: a chain of 100,000 entries (`--quick`: 20,000) appended in batches of 10,000; a full
   `verify`, the incremental one after 10 more entries (it checks those 10 only), an export and
   `verify_export` over it.

`--profile` adds cProfile of `append_in` for one batch of 2,000 events and of a full verify.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import apsw

from bench._common import (
    cores,
    count_of,
    machine_busy_s,
    new_database,
    now_ms,
    num,
    print_table,
    quiet_logging,
    scratch_dir,
)
from bench.throughput import backlog_of_catch_up, backlog_of_schedules
from engine import DaemonConfig, ManualClock, SchedulerDaemon, open_engine
from engine.backends.sqlite import SqliteBackend
from engine.backends.sqlite.audit import append_in
from engine.backends.sqlite.connection import write_tx
from engine.backends.sqlite.dispatch import fired
from engine.domain.audit import (
    AuditEntry,
    AuditEvent,
    ChainWalk,
    KeyRing,
    canonical,
    content_hash,
    entry_message,
    seal,
    tenant_chain,
)
from engine.domain.slots import slot_key
from engine.governance.audit import export, read_export, verify, verify_export
from engine.ports.dispatch import DispatchedFire, DispatchReport

BATCH = 2_000  # the daemon's default batch: fires (and audit entries) per dispatch transaction
APPEND_BATCH = 10_000
TENANT = "bench"

# -- events ---------------------------------------------------------------------------------


def fire_events(count: int, *, start: int = 0) -> list[AuditEvent]:
    """`fire.dispatched` events as the dispatcher makes them, one schedule each."""
    at = now_ms()
    events = []
    for i in range(start, start + count):
        sid = uuid.uuid4().hex
        key = slot_key(sid, at, "UTC")
        # One event per fire, as each fire had before batch entries (a chain to verify).
        events += fired([DispatchedFire(i + 1, TENANT, sid, f"s-{i}", key, at, at, at, "n1")])
    return events


# -- 1. dispatch with audit on and off ------------------------------------------------------


def _no_audit(*_args: Any, **_kwargs: Any) -> list[AuditEntry]:
    return []


@dataclass(frozen=True, slots=True)
class Drain:
    audit: bool
    fires: int
    seconds: float
    cpu_seconds: float
    exact: bool  # every slot once in the ledger
    entries: int  # audit entries written

    @property
    def per_second(self) -> float:
        return self.fires / self.seconds


def drain(path: Path, now: int, *, audit: bool, expected: int) -> Drain:
    """Step the real daemon until the backlog is dispatched; time the dispatching steps."""
    fires = 0

    def count(report: DispatchReport) -> None:
        nonlocal fires
        fires += len(report.dispatched)

    clock = ManualClock(now)
    engine = open_engine(path, clock=clock)
    engine.storage.audit.keys()  # the key file is made here, not inside the timed part
    daemon = SchedulerDaemon(
        engine.storage, clock, DaemonConfig(node_id="bench-1"), on_dispatch=count
    )
    daemon.step()  # takes the lease
    patch = mock.patch("engine.backends.sqlite.dispatch.append_in", _no_audit)
    if not audit:
        patch.start()
    try:
        cpu, started = time.process_time(), time.perf_counter()
        while True:
            before = fires
            daemon.step()
            if fires == before:
                break
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    finally:
        if not audit:
            patch.stop()
        engine.close()
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = count_of(conn, "SELECT count(*) FROM runs")
        keys = count_of(conn, "SELECT count(DISTINCT slot_key) FROM runs")
        entries = count_of(
            conn, "SELECT count(*) FROM audit_entries WHERE event = 'fire.dispatched'"
        )
    finally:
        conn.close()
    exact = fires == rows == keys == expected
    return Drain(audit, fires, seconds, cpu_seconds, exact, entries)


def copy_database(template: Path, to: Path) -> Path:
    for suffix in ("", "-wal"):
        source = template.with_name(template.name + suffix)
        if source.exists():
            shutil.copyfile(source, to.with_name(to.name + suffix))
    return to


def on_and_off(folder: Path, template: Path, now: int, count: int, reps: int) -> list[Drain]:
    """`reps` rounds of one drain with audit and one without, alternating which goes first."""
    results = []
    for rep in range(reps):
        order = (True, False) if rep % 2 == 0 else (False, True)
        for audit in order:
            db = copy_database(template, folder / f"run-{rep}-{'on' if audit else 'off'}.db")
            results.append(drain(db, now, audit=audit, expected=count))
            for leftover in folder.glob(db.name + "*"):
                leftover.unlink()
    return results


def dispatch_rows(label: str, drains: Sequence[Drain]) -> list[list[str]]:
    on = [d for d in drains if d.audit]
    off = [d for d in drains if not d.audit]
    on_rate = statistics.median(d.per_second for d in on)
    off_rate = statistics.median(d.per_second for d in off)
    on_cpu = statistics.median(d.cpu_seconds / d.fires for d in on)
    off_cpu = statistics.median(d.cpu_seconds / d.fires for d in off)
    fires = on[0].fires
    exact = all(d.exact for d in drains)
    entries_ok = all(d.entries == d.fires for d in on) and all(d.entries == 0 for d in off)

    def spread(rates: Sequence[Drain]) -> str:
        values = [d.per_second for d in rates]
        return f"{min(values):,.0f}-{max(values):,.0f}"

    return [
        [
            label,
            num(fires),
            f"{num(off_rate, 0)} ({spread(off)})",
            f"{num(on_rate, 0)} ({spread(on)})",
            f"{on_rate / off_rate:.2f}x",
            num(1e6 / on_rate - 1e6 / off_rate, 1),
            num(1e6 * (on_cpu - off_cpu), 1),
            "yes" if exact and entries_ok else "NO",
        ]
    ]


# -- 2. where an entry's cost goes -----------------------------------------------------------


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The shortest of `repeat` timings of `run()`, in seconds (as timeit recommends)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def seal_parts(count: int, keys: KeyRing) -> list[tuple[str, float]]:
    """Microseconds per entry of sealing `count` events one after another, and of its parts."""
    runs = [
        DispatchedFire(i + 1, TENANT, uuid.uuid4().hex, f"s-{i}", f"k{i}", 1, 1, 1, "n1")
        for i in range(count)
    ]
    events = [fired([run])[0] for run in runs]
    chain = tenant_chain(TENANT)
    at = now_ms()
    prev = "0" * 64
    sealed: list[AuditEntry] = []

    def build_events() -> None:
        for run in runs:
            fired([run])

    def hash_only() -> None:
        for i, e in enumerate(events, start=1):
            content_hash(
                chain=chain,
                seq=i,
                event=e.event,
                actor=e.actor,
                tenant=e.tenant,
                schedule_id=e.schedule_id,
                slot_key=e.slot_key,
                at=at,
                data=e.data,
                prev_hash=prev,
            )

    def sign_only() -> None:
        for i in range(1, count + 1):
            keys.sign(entry_message(chain, i, prev))

    def seal_all() -> None:
        sealed.clear()
        head = prev
        for i, e in enumerate(events, start=1):
            entry = seal(e, seq=i, at=at, prev_hash=head, keys=keys)
            head = entry.hash
            sealed.append(entry)

    def data_json() -> None:
        for e in events:
            canonical(dict(e.data))

    per = 1e6 / count
    return [
        (
            "build the AuditEvent (fired(run); kept in the 'off' runs)",
            per * best_of(3, build_events),
        ),
        ("seal(): content hash (canonical JSON + SHA-256)", per * best_of(3, hash_only)),
        (
            "  of which: data to canonical JSON (once; the row stores that text)",
            per * best_of(3, data_json),
        ),
        ("seal(): HMAC-SHA-256 signature", per * best_of(3, sign_only)),
        ("seal() whole", per * best_of(3, seal_all)),
    ]


@dataclass(frozen=True, slots=True)
class Batches:
    append_in_s: list[float]
    commit_s: list[float]


def append_batches(db: Path, batches: int, keys: KeyRing) -> Batches:
    """`append_in` for `batches` batches of BATCH events, each in its own transaction."""
    engine = open_engine(db)
    assert isinstance(engine.storage, SqliteBackend)
    conn = engine.storage.pool.get()
    spent, commits = [], []
    try:
        for b in range(batches):
            events = fire_events(BATCH, start=b * BATCH)
            conn.execute("BEGIN IMMEDIATE")
            started = time.perf_counter()
            append_in(conn, events, now_ms(), engine.storage.audit, keys=keys)
            middle = time.perf_counter()
            conn.execute("COMMIT")
            spent.append(middle - started)
            commits.append(time.perf_counter() - middle)
    finally:
        engine.close()
    return Batches(spent, commits)


def profile_append_in(db: Path, keys: KeyRing) -> str:
    engine = open_engine(db)
    assert isinstance(engine.storage, SqliteBackend)
    conn = engine.storage.pool.get()
    events = fire_events(BATCH)
    profiler = cProfile.Profile()
    try:
        with write_tx(conn):
            profiler.runcall(append_in, conn, events, now_ms(), engine.storage.audit, keys=keys)
    finally:
        engine.close()
    return profile_text(profiler, 18)


def profile_text(profiler: cProfile.Profile, lines: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(lines)
    return out.getvalue()


# -- 3. verify ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timed:
    what: str
    entries: int
    seconds: float
    checked: int | None = None
    intact: bool | None = None


def verify_run(folder: Path, size: int, reps: int, *, profile: bool) -> tuple[list[Timed], str]:
    db = new_database(folder / "verify.db")
    engine = open_engine(db)
    log = engine.storage.audit
    keys = log.keys()
    chain = tenant_chain(TENANT)
    out: list[Timed] = []
    profiled = ""
    try:
        append_s = 0.0
        for start in range(0, size, APPEND_BATCH):
            events = fire_events(min(APPEND_BATCH, size - start), start=start)
            started = time.perf_counter()
            log.append(events)
            append_s += time.perf_counter() - started
        out.append(Timed(f"append (own transaction, batches of {APPEND_BATCH:,})", size, append_s))

        fulls = []
        for _ in range(reps):
            started = time.perf_counter()
            result = verify(log, keys, chains=[chain], full=True)
            fulls.append((time.perf_counter() - started, result.chains[0]))
        seconds, report = sorted(fulls, key=lambda f: f[0])[len(fulls) // 2]
        out.append(Timed("verify, full", size, seconds, report.checked, report.intact))

        # Its two halves: reading the pages, and walking entries already in memory.
        pages: list[list[AuditEntry]] = []

        def read_pages() -> None:
            pages.clear()
            after = 0
            while page := log.entries(chain, after_seq=after):
                pages.append(page)
                after = page[-1].seq

        def walk_pages() -> None:
            walk = ChainWalk(chain, keys)
            for page in pages:
                for entry in page:
                    walk.feed(entry)

        out.append(
            Timed("  of which: read the pages (SQL + decode)", size, best_of(reps, read_pages))
        )
        out.append(
            Timed("  of which: walk (hash + HMAC per entry)", size, best_of(reps, walk_pages))
        )

        incs = []
        for _ in range(reps):
            log.append(fire_events(10))
            started = time.perf_counter()
            result = verify(log, keys, chains=[chain])
            incs.append((time.perf_counter() - started, result.chains[0]))
        seconds, report = sorted(incs, key=lambda f: f[0])[len(incs) // 2]
        out.append(
            Timed(
                "verify, incremental after 10 appended", 10, seconds, report.checked, report.intact
            )
        )
        total = size + 10 * reps

        path = folder / "audit-export.jsonl"
        started = time.perf_counter()
        with path.open("w", encoding="utf-8") as handle:
            exported = export(log, handle, chains=[chain])
        out.append(Timed("export (JSON lines)", exported, time.perf_counter() - started))

        def offline() -> tuple[int, bool]:
            with path.open(encoding="utf-8") as handle:
                result = verify_export(read_export(handle), keys)
            return result.chains[0].checked, result.intact

        offlines = []
        for _ in range(reps):
            started = time.perf_counter()
            checked, intact = offline()
            offlines.append((time.perf_counter() - started, checked, intact))
        seconds, checked, intact = sorted(offlines)[len(offlines) // 2]
        out.append(Timed("verify_export over the export", total, seconds, checked, intact))

        def parse_only() -> None:
            with path.open(encoding="utf-8") as handle:
                for _ in read_export(handle):
                    pass

        out.append(Timed("  of which: parse the lines", total, best_of(reps, parse_only)))
        if profile:
            profiler = cProfile.Profile()
            profiler.runcall(verify, log, keys, chains=[chain], full=True)
            profiled = profile_text(profiler, 18)
    finally:
        engine.close()
    return out, profiled


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller backlogs and chain")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile of append_in (2,000) and a full verify"
    )
    args = parser.parse_args()
    quiet_logging()
    count = 10_000 if args.quick else 100_000
    size = 20_000 if args.quick else 100_000
    reps = 3
    seal_count = 10_000 if args.quick else 50_000
    batches = 5 if args.quick else 20
    cpu0, wall0, busy0 = time.process_time(), time.perf_counter(), machine_busy_s()

    with scratch_dir() as folder:
        now = now_ms()
        templates = folder / "templates"
        templates.mkdir()
        backlogs = [
            (f"{count:,} schedules, 1 due slot each", backlog_of_schedules(templates, count, now)),
            (
                f"{count // 100:,} schedules x 100 missed slots (each)",
                backlog_of_catch_up(templates, count, now),
            ),
        ]
        table = []
        for label, template in backlogs:
            table += dispatch_rows(label, on_and_off(folder, template, now, count, reps))
        print_table(
            f"Dispatch throughput with the audit chain on and off, fires per second: backlog of "
            f"{count:,} due slots, one node, SQLite WAL, batches of {BATCH:,}; median of {reps} "
            "runs each (range), alternating which runs first; off = dispatch's append_in "
            "replaced by a no-op (benchmark only)",
            [
                "backlog",
                "fires",
                "audit off",
                "audit on",
                "on / off",
                "audit us/fire (wall)",
                "audit us/fire (CPU)",
                "exactly once, 1 entry/fire",
            ],
            table,
        )

        keys = KeyRing([uuid.uuid4().bytes * 2])
        parts = seal_parts(seal_count, keys)
        appended = append_batches(new_database(folder / "append.db"), batches, keys)
        append_us = 1e6 * statistics.median(appended.append_in_s) / BATCH
        commit_us = 1e6 * statistics.median(appended.commit_s) / BATCH
        seal_us = dict(parts)["seal() whole"]
        rows = [[what, num(us, 2), f"{100 * us / append_us:.0f}%"] for what, us in parts]
        rows += [
            [
                f"append_in, batch of {BATCH:,} (median of {batches})",
                num(append_us, 2),
                "100%",
            ],
            [
                "  of which not seal(): head lookup, row values, INSERT",
                num(append_us - seal_us, 2),
                f"{100 * (append_us - seal_us) / append_us:.0f}%",
            ],
            ["COMMIT after append_in (WAL, synchronous=NORMAL)", num(commit_us, 2), "-"],
        ]
        print_table(
            f"Cost of one audit entry, microseconds: seal() over {seal_count:,} events (best of "
            f"3), append_in for {batches} batches of {BATCH:,} into one chain",
            ["step", "us per entry", "of append_in"],
            rows,
        )
        spent = [1e3 * s for s in appended.append_in_s]
        print(
            f"append_in for one batch of {BATCH:,}: {statistics.median(spent):.1f} ms "
            f"(min {min(spent):.1f}, max {max(spent):.1f})"
        )
        profiled_append = (
            profile_append_in(new_database(folder / "profile.db"), keys) if args.profile else ""
        )

        timed, profiled_verify = verify_run(folder, size, reps, profile=args.profile)
        full = next(t for t in timed if t.what == "verify, full")
        print_table(
            f"Audit verify: one chain of {size:,} entries (fire.dispatched), median of {reps} "
            f"runs (the 'of which' parts: best of {reps})",
            [
                "what",
                "entries",
                "time ms",
                "entries/s",
                "us/entry",
                "time / full verify",
                "checked",
                "intact",
            ],
            [
                [
                    t.what,
                    num(t.entries),
                    num(1e3 * t.seconds, 1),
                    num(t.entries / t.seconds, 0),
                    num(1e6 * t.seconds / t.entries, 2),
                    f"{100 * t.seconds / full.seconds:.1f}%",
                    "-" if t.checked is None else num(t.checked),
                    "-" if t.intact is None else ("yes" if t.intact else "NO"),
                ]
                for t in timed
            ],
        )
        incremental = next(t for t in timed if t.what.startswith("verify, incremental"))
        print(
            f"incremental verify checked {incremental.checked} entries "
            f"({'as expected' if incremental.checked == 10 else 'EXPECTED 10'})"
        )
    others = machine_busy_s() - busy0 - (time.process_time() - cpu0)
    others_share = others / ((time.perf_counter() - wall0) * cores())
    if args.profile:
        print(f"\ncProfile of append_in, one batch of {BATCH:,} events (by own time):")
        print(profiled_append)
        print(f"cProfile of a full verify of {size + 10 * reps:,} entries (by own time):")
        print(profiled_verify)
    print(f"other processes used {100 * others_share:.0f}% of the {cores()} cores meanwhile")


if __name__ == "__main__":
    main()
