"""What the audit chain costs: per dispatch batch and per fire, and to verify.

1. Dispatch with the audit on and off: the backlogs of `throughput.py` (one due slot on each of
   N schedules; N/100 schedules 100 slots behind, misfire `each`), 100,000 due slots (`--quick`:
   10,000), drained by the real daemon on a frozen manual clock. A dispatch transaction writes
   ONE `fires.dispatched` entry per tenant, committing to all its runs (their ids and a digest);
   there is no setting to turn it off, so "off" replaces the dispatcher's `append_in` (seal the
   batch entries and insert them, inside the dispatch transaction) with a function that does
   nothing, for this benchmark only; the batch's `AuditEvent` (`fired()`: id ranges and the
   digest) is still built, and section 2 says what that costs. Both modes in one process on
   copies of one backlog file, alternating which goes first, several rounds; medians. Checked
   after each drain: every slot dispatched exactly once, and the audit rows are one per
   transaction and tenant whose `count`s add up to the fires.
2. What one batch entry costs, per batch of 2,000 fires (the daemon's batch) and per fire:
   `fired()` (sort, id ranges, digest), `seal()` of the batch event and its parts (canonical
   JSON + SHA-256, HMAC), an Ed25519 seal (chain openings, transitions, a checkpoint every
   1,000 entries), and `append_in` of one batch entry in a transaction of its own.
3. Verify: a chain of 100,000 entries (`--quick`: 20,000) as operator actions make them,
   appended in batches of 10,000; a full `verify`, the incremental one after 10 more entries
   (it checks those 10 only), an export (heads signed), `verify_export` with the secret key and
   with the public key alone (what `verify --file --public-key` does); and the ledger: a full
   verify of a database drained in section 1 (its batch entries against its runs, then every
   dispatched run looked up in a batch), per run.

`--profile` adds cProfile of one dispatch drain with the audit on and of a full verify.
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
from engine.backends.sqlite.dispatch import fired
from engine.domain.audit import (
    FIRES_DISPATCHED,
    AuditEntry,
    AuditEvent,
    ChainWalk,
    KeyRing,
    canonical,
    checkpoint_message,
    content_hash,
    entry_message,
    fires_digest,
    seal,
    tenant_chain,
)
from engine.governance.audit import PublicRoot, export, read_export, verify, verify_export
from engine.ports.dispatch import DispatchedFire, DispatchReport
from engine.runtime.daemon import DEFAULT_LOOKAHEAD_MS

BATCH = 2_000  # the daemon's default batch: fires per dispatch transaction
APPEND_BATCH = 10_000
TENANT = "bench"
TARGET = 0.95  # issue 16: dispatch with the audit on at >= 0.95x of it off

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
    transactions: int  # dispatch transactions that fired something
    expected_entries: int  # one per transaction and tenant
    entries: int  # fires.dispatched entries written
    committed: int  # the sum of their `count`s

    @property
    def per_second(self) -> float:
        return self.fires / self.seconds

    @property
    def audit_ok(self) -> bool:
        """On: one entry per transaction and tenant, counting every fire; off: none."""
        if not self.audit:
            return self.entries == 0
        return self.entries == self.expected_entries and self.committed == self.fires


def drain(
    path: Path, now: int, *, audit: bool, expected: int, profiler: cProfile.Profile | None = None
) -> Drain:
    """Step the real daemon until the backlog is dispatched; time the dispatching steps."""
    fires = transactions = expected_entries = 0

    def count(report: DispatchReport) -> None:
        nonlocal fires, transactions, expected_entries
        fires += len(report.dispatched)
        if report.dispatched:
            transactions += 1
            expected_entries += len({f.tenant for f in report.dispatched})

    clock = ManualClock(now)
    engine = open_engine(path, clock=clock)
    engine.storage.audit.establish()  # the key file and its check: not inside the timed part
    daemon = SchedulerDaemon(
        engine.storage, clock, DaemonConfig(node_id="bench-1"), on_dispatch=count
    )
    daemon.step()  # takes the lease
    patch = mock.patch("engine.backends.sqlite.dispatch.append_in", _no_audit)
    if not audit:
        patch.start()
    try:
        if profiler is not None:
            profiler.enable()
        cpu, started = time.process_time(), time.perf_counter()
        while True:
            before = fires
            daemon.step()
            if fires == before:
                break
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
        if profiler is not None:
            profiler.disable()
    finally:
        if not audit:
            patch.stop()
        engine.close()
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = count_of(conn, "SELECT count(*) FROM runs")
        slots = count_of(
            conn, "SELECT count(*) FROM (SELECT DISTINCT schedule_id, slot_at FROM runs)"
        )
        entries = count_of(
            conn, f"SELECT count(*) FROM audit_entries WHERE event = '{FIRES_DISPATCHED}'"
        )
        committed = count_of(
            conn,
            "SELECT coalesce(sum(json_extract(data, '$.count')), 0) FROM audit_entries "
            f"WHERE event = '{FIRES_DISPATCHED}'",
        )
    finally:
        conn.close()
    exact = fires == rows == slots == expected
    return Drain(
        audit,
        fires,
        seconds,
        cpu_seconds,
        exact,
        transactions,
        expected_entries,
        entries,
        committed,
    )


def copy_database(template: Path, to: Path) -> Path:
    for suffix in ("", "-wal"):
        source = template.with_name(template.name + suffix)
        if source.exists():
            shutil.copyfile(source, to.with_name(to.name + suffix))
    return to


def on_and_off(
    folder: Path, template: Path, now: int, expected: int, rounds: int, *, keep: Path | None
) -> list[Drain]:
    """`rounds` rounds of one drain with audit and one without, alternating which goes first.
    With `keep`, the first audited drain's database is kept there (for the ledger verify)."""
    results = []
    for audit in (True, False):  # a warm-up of each (page cache, first imports): not counted
        db = copy_database(template, folder / f"warm-{'on' if audit else 'off'}.db")
        drain(db, now, audit=audit, expected=expected)
        for leftover in folder.glob(db.name + "*"):
            leftover.unlink()
    for rep in range(rounds):
        order = (True, False) if rep % 2 == 0 else (False, True)
        for audit in order:
            db = copy_database(template, folder / f"run-{rep}-{'on' if audit else 'off'}.db")
            results.append(drain(db, now, audit=audit, expected=expected))
            if keep is not None and audit and rep == 0:
                for part in folder.glob(db.name + "*"):
                    part.rename(keep.with_name(keep.name + part.name[len(db.name) :]))
                continue
            for leftover in folder.glob(db.name + "*"):
                leftover.unlink()
    return results


def dispatch_row(label: str, drains: Sequence[Drain]) -> tuple[list[str], float]:
    on = [d for d in drains if d.audit]
    off = [d for d in drains if not d.audit]
    on_rate = statistics.median(d.per_second for d in on)
    off_rate = statistics.median(d.per_second for d in off)
    on_cpu = statistics.median(d.cpu_seconds / d.fires for d in on)
    off_cpu = statistics.median(d.cpu_seconds / d.fires for d in off)
    exact = all(d.exact for d in drains)
    audit_ok = all(d.audit_ok for d in drains)
    ratio = on_rate / off_rate

    def spread(rates: Sequence[Drain]) -> str:
        values = [d.per_second for d in rates]
        return f"{min(values):,.0f}-{max(values):,.0f}"

    sample = on[0]
    row = [
        label,
        num(sample.fires),
        f"{num(off_rate, 0)} ({spread(off)})",
        f"{num(on_rate, 0)} ({spread(on)})",
        f"{ratio:.3f}x " + ("ok" if ratio >= TARGET else f"< {TARGET}"),
        num(1e6 / on_rate - 1e6 / off_rate, 2),
        num(1e6 * (on_cpu - off_cpu), 2),
        "yes" if exact else "NO",
        f"{num(sample.transactions)} / {num(sample.entries)} / {num(sample.committed)}"
        + ("" if audit_ok else " NO"),
    ]
    return row, ratio


# -- 2. what one batch entry costs -----------------------------------------------------------


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The shortest of `repeat` timings of `run()`, in seconds (as timeit recommends)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def batch_runs(size: int, first_id: int = 1) -> list[DispatchedFire]:
    """A dispatch transaction's runs as the dispatcher hands them to `fired`: consecutive ids."""
    at = now_ms()
    return [
        DispatchedFire(first_id + i, TENANT, uuid.uuid4().hex, f"s-{i}", f"k{i}", at, at, at, "n1")
        for i in range(size)
    ]


def batch_parts(loops: int, keys: KeyRing) -> list[tuple[str, float]]:
    """Microseconds per batch of BATCH runs: building its event, sealing it, and the parts."""
    runs = batch_runs(BATCH)
    (event,) = fired(runs)
    chain = tenant_chain(TENANT)
    at = now_ms()
    prev = "0" * 64
    as_fired = [(r.run_id, r.schedule_id, r.slot_key, r.slot_at, r.due_at) for r in runs]

    def repeat(step: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(loops):
                step()

        return run

    def hash_only() -> str:
        return content_hash(
            chain=chain,
            seq=1,
            event=event.event,
            actor=event.actor,
            tenant=event.tenant,
            schedule_id=None,
            slot_key=None,
            at=at,
            data=event.data,
            prev_hash=prev,
        )

    message = entry_message(chain, 1, prev)
    per = 1e6 / loops
    return [
        (
            "fired(runs): the batch's event (sort, id ranges, digest)",
            per * best_of(3, repeat(lambda: fired(runs))),
        ),
        (
            f"  of which: fires_digest over {BATCH:,} runs (SHA-256)",
            per * best_of(3, repeat(lambda: fires_digest(as_fired))),
        ),
        ("seal(): content hash (canonical JSON + SHA-256)", per * best_of(3, repeat(hash_only))),
        (
            "  of which: data to canonical JSON",
            per * best_of(3, repeat(lambda: canonical(dict(event.data)))),
        ),
        ("seal(): HMAC-SHA-256 signature", per * best_of(3, repeat(lambda: keys.sign(message)))),
        (
            "seal() whole",
            per * best_of(3, repeat(lambda: seal(event, seq=1, at=at, prev_hash=prev, keys=keys))),
        ),
        (
            "Ed25519 seal (openings, transitions; a checkpoint per 1,000 entries)",
            per * best_of(3, repeat(lambda: keys.seal(checkpoint_message(chain, 1000, prev)))),
        ),
    ]


def append_batches(db: Path, batches: int) -> list[float]:
    """`append_in` of one batch entry (BATCH runs), each in its own transaction: seconds."""
    engine = open_engine(db)
    assert isinstance(engine.storage, SqliteBackend)
    engine.storage.audit.establish()
    conn = engine.storage.pool.get()
    spent = []
    try:
        for b in range(batches + 1):
            events = fired(batch_runs(BATCH, first_id=1 + b * BATCH))
            conn.execute("BEGIN IMMEDIATE")
            started = time.perf_counter()
            append_in(conn, events, now_ms(), engine.storage.audit)
            if b:  # the first opens the chain (its opening entry, an Ed25519 seal)
                spent.append(time.perf_counter() - started)
            conn.execute("COMMIT")
    finally:
        engine.close()
    return spent


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
    unit: str = "entries"  # what `entries` counts


def operator_events(count: int, *, start: int = 0) -> list[AuditEvent]:
    """Entries as operator actions make them (one each): a schedule triggered by hand."""
    return [
        AuditEvent(
            "schedule.triggered",
            actor="alice",
            tenant=TENANT,
            schedule_id=f"{i:032x}",
            data={"name": f"s-{i}", "run": i + 1},
        )
        for i in range(start, start + count)
    ]


def median_of(reps: int, run: Callable[[], tuple[int, bool]]) -> tuple[float, int, bool]:
    found = []
    for _ in range(reps):
        started = time.perf_counter()
        checked, intact = run()
        found.append((time.perf_counter() - started, checked, intact))
    return sorted(found)[len(found) // 2]


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
            events = operator_events(min(APPEND_BATCH, size - start), start=start)
            started = time.perf_counter()
            log.append(events)
            append_s += time.perf_counter() - started
        keys = log.keys()
        head = log.head(chain).seq  # with the chain's opening
        out.append(Timed(f"append (own transaction, batches of {APPEND_BATCH:,})", size, append_s))

        def full() -> tuple[int, bool]:
            report = verify(log, keys, chains=[chain], full=True).chains[0]
            return report.checked, report.intact

        seconds, checked, intact = median_of(reps, full)
        out.append(Timed("verify, full", head, seconds, checked, intact))

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
            Timed("  of which: read the pages (SQL + decode)", head, best_of(reps, read_pages))
        )
        out.append(
            Timed("  of which: walk (hash + HMAC per entry)", head, best_of(reps, walk_pages))
        )

        incs = []
        for _ in range(reps):
            log.append(operator_events(10))
            started = time.perf_counter()
            report = verify(log, keys, chains=[chain]).chains[0]
            incs.append((time.perf_counter() - started, report.checked, report.intact))
        seconds, checked, intact = sorted(incs)[len(incs) // 2]
        out.append(Timed("verify, incremental after 10 appended", 10, seconds, checked, intact))
        total = head + 10 * reps

        path = folder / "audit-export.jsonl"
        started = time.perf_counter()
        with path.open("w", encoding="utf-8") as handle:
            exported = export(log, handle, chains=[chain], keys=keys)
        out.append(
            Timed("export (JSON lines, head signed)", exported, time.perf_counter() - started)
        )

        identity = log.identity()
        assert identity is not None
        root_period = min(identity[1], key=lambda p: p.epoch)
        root = PublicRoot(identity[0], root_period.key_id, root_period.public_key)

        def offline(
            ring: KeyRing | None, public: PublicRoot | None
        ) -> Callable[[], tuple[int, bool]]:
            def run() -> tuple[int, bool]:
                with path.open(encoding="utf-8") as handle:
                    result = verify_export(read_export(handle), ring, root=public)
                return result.chains[0].checked, result.intact

            return run

        seconds, checked, intact = median_of(reps, offline(keys, None))
        out.append(
            Timed("verify_export, secret key (HMAC per entry)", total, seconds, checked, intact)
        )
        seconds, checked, intact = median_of(reps, offline(None, root))
        out.append(
            Timed(
                "verify_export --public-key (no secret: signed head)",
                total,
                seconds,
                checked,
                intact,
            )
        )

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


def verify_ledger(db: Path, reps: int) -> Timed:
    """A full verify of a drained database: its batch entries against its run rows."""
    engine = open_engine(db)
    log = engine.storage.audit
    try:
        keys = log.keys()
        conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            runs = count_of(conn, "SELECT count(*) FROM runs")
        finally:
            conn.close()
        chain = tenant_chain("default")

        def run() -> tuple[int, bool]:
            report = verify(log, keys, chains=[chain], full=True, record=False).chains[0]
            return report.batches_checked, report.intact

        seconds, batches, intact = median_of(reps, run)
    finally:
        engine.close()
    return Timed(
        f"verify, full, ledger: {batches:,} batch entries against their runs",
        runs,
        seconds,
        batches,
        intact,
        unit="runs",
    )


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller backlogs and chain")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile of an audited drain and a full verify"
    )
    args = parser.parse_args()
    quiet_logging()
    count = 10_000 if args.quick else 100_000
    size = 20_000 if args.quick else 100_000
    rounds = 7
    reps = 3
    loops = 200 if args.quick else 1_000
    batches = 20 if args.quick else 100
    cpu0, wall0, busy0 = time.process_time(), time.perf_counter(), machine_busy_s()

    with scratch_dir() as folder:
        now = now_ms()
        templates = folder / "templates"
        templates.mkdir()
        # A schedule every second has its next slot within the default lookahead: it fires too.
        ahead = count // 100 if DEFAULT_LOOKAHEAD_MS >= 500 else 0
        backlogs = [
            (
                f"{count:,} schedules, 1 due slot each",
                backlog_of_schedules(templates, count, now),
                count,
            ),
            (
                f"{count // 100:,} schedules x 100 missed slots (each)"
                + (" + 1 ahead" if ahead else ""),
                backlog_of_catch_up(templates, count, now),
                count + ahead,
            ),
        ]
        ledger_db = folder / "ledger.db"
        table, ratios = [], []
        for n, (label, template, expected) in enumerate(backlogs):
            keep = ledger_db if n == 0 else None
            row, ratio = dispatch_row(
                label, on_and_off(folder, template, now, expected, rounds, keep=keep)
            )
            table.append(row)
            ratios.append(ratio)
        print_table(
            f"Dispatch throughput with the audit chain on and off, fires per second: backlogs of "
            f"{count:,} due slots, one node, SQLite WAL, batches of {BATCH:,}; median of {rounds} "
            "rounds each (range) after a warm-up, alternating which runs first; off = "
            f"dispatch's append_in replaced by a no-op (benchmark only); target on/off >= {TARGET}",
            [
                "backlog",
                "fires",
                "audit off",
                "audit on",
                "on / off",
                "audit us/fire (wall)",
                "audit us/fire (CPU)",
                "exactly once",
                "tx / entries / sum(count)",
            ],
            table,
        )

        keys = KeyRing([uuid.uuid4().bytes * 2])
        parts = batch_parts(loops, keys)
        appended = append_batches(new_database(folder / "append.db"), batches)
        append_us = 1e6 * statistics.median(appended)
        fired_us = dict(parts)["fired(runs): the batch's event (sort, id ranges, digest)"]
        rows = [[what, num(us, 1), num(us / BATCH, 3)] for what, us in parts]
        rows.append(
            [
                f"append_in of one batch entry, own transaction (median of {batches})",
                num(append_us, 1),
                num(append_us / BATCH, 3),
            ]
        )
        rows.append(
            [
                "a batch's audit in all: fired() + append_in",
                num(fired_us + append_us, 1),
                num((fired_us + append_us) / BATCH, 3),
            ]
        )
        print_table(
            f"Cost of one batch entry (committing to {BATCH:,} fires), microseconds: best of 3 "
            f"of {loops:,} loops; append_in median of {batches} batches into one chain",
            ["step", f"us per batch of {BATCH:,}", "us per fire"],
            rows,
        )
        print(
            "off in section 1 still builds fired(): counted as audit cost, on/off would be "
            + ", ".join(
                f"{r * (1 - fired_us / BATCH * 1e-6 * _off_rate(t)):.3f}x"
                for r, t in zip(ratios, table, strict=True)
            )
        )

        timed, profiled_verify = verify_run(folder, size, reps, profile=args.profile)
        timed.append(verify_ledger(ledger_db, reps))
        print_table(
            f"Audit verify: one chain of {size:,} operator entries; the ledger of section 1's "
            f"first backlog ({count:,} runs); median of {reps} runs (the 'of which' parts: best "
            f"of {reps})",
            [
                "what",
                "entries / runs",
                "time ms",
                "per second",
                "us per entry/run",
                "checked",
                "intact",
            ],
            [
                [
                    t.what,
                    f"{num(t.entries)} {t.unit}",
                    num(1e3 * t.seconds, 1),
                    num(t.entries / t.seconds, 0),
                    num(1e6 * t.seconds / t.entries, 2),
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
        profiled_drain = ""
        if args.profile:
            profiler = cProfile.Profile()
            label, template, expected = backlogs[0]
            db = copy_database(template, folder / "profile.db")
            drain(db, now, audit=True, expected=expected, profiler=profiler)
            profiled_drain = profile_text(profiler, 24)
    others = machine_busy_s() - busy0 - (time.process_time() - cpu0)
    others_share = others / ((time.perf_counter() - wall0) * cores())
    if args.profile:
        print(f"\ncProfile of a drain of {count:,} fires with the audit on (by own time):")
        print(profiled_drain)
        print(f"cProfile of a full verify of {size + 10 * reps:,} entries (by own time):")
        print(profiled_verify)
    print(f"other processes used {100 * others_share:.0f}% of the {cores()} cores meanwhile")


def _off_rate(row: Sequence[str]) -> float:
    """The off median of a section-1 row, fires per second."""
    return float(row[2].split(" ")[0].replace(",", ""))


if __name__ == "__main__":
    main()
