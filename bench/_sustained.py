"""The sustained load: N interval schedules every second, dispatched by the real daemon on the
system clock, measured for exactly-once, lateness, CPU and memory (headline, lateness, and the
Vortos side of vs_apscheduler)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import apsw

from bench._common import (
    Spread,
    bulk_insert,
    cores,
    count_of,
    interval_rows,
    machine_busy_s,
    new_database,
    now_ms,
    num,
    peak_rss_mib,
    print_table,
    reanchor,
    scratch_dir,
    verdict,
)
from engine import DaemonConfig, SchedulerDaemon, SystemClock, open_engine
from engine.ports.dispatch import DispatchReport
from engine.runtime.daemon import DEFAULT_LOOKAHEAD_MS

LEAD_MS = 1500  # from the end of setup to the first slot: the daemon takes the lease meanwhile
STALL_S = 10.0  # after the window, a run that dispatched nothing for this long is over


@dataclass(slots=True)
class _Recorder:
    """Runs in the daemon thread after each dispatch transaction has committed."""

    first_slot: int
    last_slot: int
    commit_lateness: list[float] = field(default_factory=list)
    transactions: int = 0
    in_window: int = 0

    def __call__(self, report: DispatchReport) -> None:
        committed = time.time_ns() / 1e6
        if not report.dispatched:
            return
        self.transactions += 1
        for fire in report.dispatched:
            if self.first_slot <= fire.slot_at <= self.last_slot:
                # A fire is claimable from max(commit, due): one written ahead (lookahead)
                # waits for its instant, so it is not late.
                self.commit_lateness.append(max(0.0, committed - fire.due_at))
                self.in_window += 1


@dataclass(frozen=True, slots=True)
class SustainedResult:
    schedules: int
    seconds: int
    spread: bool
    expected: int
    dispatched: int  # distinct (schedule, slot) pairs of the window in the ledger
    fire_rows: int  # fire-queue rows of the window
    duplicate_pairs: int  # (schedule, slot) pairs with more than one run
    duplicate_keys: int  # runs minus distinct slot keys, ledger and fire queue together
    commit_lateness: Spread  # wall clock after the commit returned, minus the slot instant
    tx_lateness: Spread  # dispatched_at (the transaction's `now`) minus the slot instant
    transactions: int
    cpu_s: float
    wall_s: float
    others_cpu_s: float  # CPU seconds other processes on the machine used meanwhile
    peak_rss_mib: float

    @property
    def missed(self) -> int:
        return self.expected - self.dispatched

    lookahead_ms: int = DEFAULT_LOOKAHEAD_MS


def _wait_for(recorder: _Recorder, expected: int, *, end: float) -> None:
    """Until the window is over and all its slots are dispatched, or dispatching stalls."""
    seen, progress_at = 0, time.time()
    while time.time() < end or recorder.in_window < expected:
        time.sleep(0.02)
        if recorder.in_window != seen:
            seen, progress_at = recorder.in_window, time.time()
        elif time.time() > max(end, progress_at + STALL_S):
            return


def run_sustained(
    count: int, seconds: int, *, spread: bool, lookahead_ms: int = DEFAULT_LOOKAHEAD_MS
) -> SustainedResult:
    """`count` schedules every 1 s for `seconds` slots each, dispatched by the real daemon on the
    system clock in a thread of this process, with the daemon's default lookahead unless
    `lookahead_ms` says otherwise.

    Aligned (`spread=False`): every schedule has the same anchor, so each second all `count`
    slots fall due at one instant (the worst case). Spread: the anchors are spread evenly over
    the second, as for schedules created at different instants.
    """
    with scratch_dir() as folder:
        db = new_database(folder / "vortos.db")
        bulk_insert(db, interval_rows(count, every_ms=1000, anchor_ms=now_ms(), prefix="s"))
        first = (now_ms() + LEAD_MS) // 1000 * 1000 + 1000
        # The window holds exactly `seconds` slots of every schedule, aligned or spread.
        last = first + seconds * 1000 - 1
        reanchor(db, every_ms=1000, first_ms=first, spread_ms=1000 if spread else 0)

        engine = open_engine(db, clock=SystemClock())
        recorder = _Recorder(first, last)
        daemon = SchedulerDaemon(
            engine.storage,
            engine.clock,
            DaemonConfig(node_id="bench-1", lookahead_ms=lookahead_ms),
            on_dispatch=recorder,
        )
        thread = threading.Thread(target=daemon.run, name="vortos-daemon", daemon=True)
        thread.start()
        time.sleep(max(0.0, first / 1000 - time.time()))
        cpu0, wall0, busy0 = time.process_time(), time.time(), machine_busy_s()
        expected = count * seconds
        _wait_for(recorder, expected, end=(last + 1) / 1000)
        if not thread.is_alive():
            raise RuntimeError("the daemon thread died: see its traceback above")
        cpu_s, wall_s = time.process_time() - cpu0, time.time() - wall0
        others_s = machine_busy_s() - busy0 - cpu_s
        daemon.stop()
        thread.join(timeout=30)
        engine.close()
        result = _verify(db, recorder, count, seconds, spread, (cpu_s, wall_s, others_s))
        return replace(result, lookahead_ms=lookahead_ms)


def _verify(
    db: Path,
    recorder: _Recorder,
    count: int,
    seconds: int,
    spread: bool,
    times: tuple[float, float, float],
) -> SustainedResult:
    cpu_s, wall_s, others_s = times
    window = (recorder.first_slot, recorder.last_slot)
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:

        def one(sql: str, args: tuple[Any, ...] = ()) -> int:
            return count_of(conn, sql, args)

        dispatched = one(
            "SELECT count(*) FROM (SELECT 1 FROM runs WHERE slot_at BETWEEN ? AND ? "
            "GROUP BY schedule_id, slot_at)",
            window,
        )
        duplicate_pairs = one(
            "SELECT count(*) FROM (SELECT 1 FROM runs GROUP BY schedule_id, slot_at "
            "HAVING count(*) > 1)"
        )
        duplicate_keys = one("SELECT count(*) - count(DISTINCT slot_key) FROM runs") + one(
            "SELECT count(*) - count(DISTINCT run_id) FROM fire_queue"
        )
        fire_rows = one("SELECT count(*) FROM fire_queue WHERE slot_at BETWEEN ? AND ?", window)
        tx_lateness = [
            float(r[0])
            for r in conn.execute(
                "SELECT dispatched_at - due_at FROM runs WHERE slot_at BETWEEN ? AND ?", window
            )
        ]
    finally:
        conn.close()
    return SustainedResult(
        schedules=count,
        seconds=seconds,
        spread=spread,
        expected=count * seconds,
        dispatched=dispatched,
        fire_rows=fire_rows,
        duplicate_pairs=duplicate_pairs,
        duplicate_keys=duplicate_keys,
        commit_lateness=Spread.of(recorder.commit_lateness),
        tx_lateness=Spread.of(tx_lateness),
        transactions=recorder.transactions,
        cpu_s=cpu_s,
        wall_s=wall_s,
        others_cpu_s=others_s,
        peak_rss_mib=peak_rss_mib(),
    )


def print_sustained(result: SustainedResult, *, target_p99_ms: float | None) -> None:
    """The table headline.py and lateness.py print; no lateness target when `target_p99_ms` is
    None (a run for reference)."""
    r = result
    lat, tx = r.commit_lateness, r.tx_lateness
    anchors = (
        "anchors spread evenly over the second"
        if r.spread
        else "one anchor: each second every slot falls due at the same instant"
    )
    if r.lookahead_ms == DEFAULT_LOOKAHEAD_MS:
        anchors += f"; daemon defaults (lookahead {r.lookahead_ms} ms)"
    else:
        anchors += f"; daemon --lookahead {r.lookahead_ms} ms"
    print_table(
        f"Vortos: {r.schedules:,} interval schedules every 1 s for {r.seconds} s, system clock, "
        f"one node, SQLite WAL; {anchors}",
        ["measure", "value"],
        [
            ["slots expected", num(r.expected)],
            ["slots dispatched (distinct schedule+slot in the ledger)", num(r.dispatched)],
            ["fire-queue rows for those slots", num(r.fire_rows)],
            ["duplicates: (schedule, slot) pairs with >1 run", num(r.duplicate_pairs)],
            ["duplicates: rows minus distinct slot keys", num(r.duplicate_keys)],
            ["missed", num(r.missed)],
            ["dispatch transactions", num(r.transactions)],
            ["fires per transaction", num(r.dispatched / max(1, r.transactions))],
            ["lateness p50 (ms, commit returned - slot)", num(lat.p50)],
            ["lateness p99 (ms)", num(lat.p99)],
            ["lateness max (ms)", num(lat.max)],
            ["lateness p99 at transaction start (ms, dispatched_at - slot)", num(tx.p99)],
            ["wall seconds measured", num(r.wall_s, 2)],
            ["CPU seconds (user+sys, whole process)", num(r.cpu_s, 2)],
            ["CPU share of one core", f"{100 * r.cpu_s / max(r.wall_s, 1e-9):.1f}%"],
            ["peak RSS (MiB)", num(r.peak_rss_mib)],
            [
                f"other processes' CPU meanwhile (share of the machine's {cores()} cores)",
                f"{100 * r.others_cpu_s / max(r.wall_s * cores(), 1e-9):.0f}%",
            ],
        ],
    )
    exact = r.missed == 0 and r.duplicate_pairs == 0 and r.duplicate_keys == 0
    if target_p99_ms is not None:
        on_time = lat.p99 < target_p99_ms
        print(f"target p99 < {target_p99_ms:g} ms: {verdict(on_time)} ({num(lat.p99)} ms)")
    print(f"target every slot exactly once, none missed: {verdict(exact)}")
