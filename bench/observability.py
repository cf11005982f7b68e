"""What metrics and tracing cost the dispatch path: throughput with them on vs off, in one run.

The backlogs of `throughput.py` (one due slot on each of N schedules; N/100 schedules 100 slots
behind, misfire `each`), 100,000 due slots (`--quick`: 10,000), drained by the real daemon on a
frozen manual clock, three ways on copies of one backlog file: no observer (the engine as a
library: the default); `PrometheusMetrics` (fires, lateness, misfires, tick durations, the
cardinality guard, each dispatch transaction's plans recorded); and the same plus OpenTelemetry
tracing (`tracing()`: one `vortos.dispatch` span per transaction, a `vortos.fire` child per fire
when the span records). Several rounds, rotating which mode goes first; medians.

What tracing costs depends on the SDK the process configures: with the API alone (the `otel`
extra) spans are the API's no-ops, which is what this measures unless an SDK is installed and
`--sdk` is given (then an SDK `TracerProvider` that samples everything and exports nowhere).
Also: the time to render one scrape of the registry after the run (schedule labels capped at
200 by the guard, whatever N is).
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
from prometheus_client import generate_latest

from bench._common import (
    cores,
    count_of,
    machine_busy_s,
    num,
    print_table,
    quiet_logging,
    scratch_dir,
)
from bench.throughput import backlog_of_catch_up, backlog_of_schedules
from engine import DaemonConfig, ManualClock, SchedulerDaemon, open_engine
from engine.observability import Observer, Observers, PrometheusMetrics, tracing
from engine.ports.dispatch import DispatchReport

MODES = ("off", "metrics", "metrics+tracing")


@dataclass(frozen=True, slots=True)
class Drain:
    mode: str
    fires: int
    seconds: float
    cpu_seconds: float
    exact: bool  # every slot once in the ledger
    scrape_ms: float  # rendering the registry once after the drain (NaN without metrics)

    @property
    def per_second(self) -> float:
        return self.fires / self.seconds


def observer_for(
    mode: str, provider: Any | None
) -> tuple[Observer | None, PrometheusMetrics | None]:
    if mode == "off":
        return None, None
    metrics = PrometheusMetrics()
    if mode == "metrics":
        return metrics, metrics
    spans = tracing(provider)
    assert spans is not None
    return Observers(metrics, spans), metrics


def drain(path: Path, now: int, mode: str, expected: int, provider: Any | None) -> Drain:
    """Step the real daemon until the backlog is dispatched; time the dispatching steps."""
    fires = 0

    def count(report: DispatchReport) -> None:
        nonlocal fires
        fires += len(report.dispatched)

    clock = ManualClock(now)
    engine = open_engine(path, clock=clock)
    engine.storage.audit.keys()  # the key file is made here, not inside the timed part
    observer, metrics = observer_for(mode, provider)
    daemon = SchedulerDaemon(
        engine.storage, clock, DaemonConfig(node_id="bench-1"), on_dispatch=count, observer=observer
    )
    daemon.step()  # takes the lease
    try:
        cpu, started = time.process_time(), time.perf_counter()
        while True:
            before = fires
            daemon.step()
            if fires == before:
                break
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    finally:
        engine.close()
    scrape_ms = float("nan")
    if metrics is not None:
        rendered = time.perf_counter()
        generate_latest(metrics.registry)
        scrape_ms = (time.perf_counter() - rendered) * 1000
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = count_of(conn, "SELECT count(*) FROM runs")
        keys = count_of(conn, "SELECT count(DISTINCT slot_key) FROM runs")
    finally:
        conn.close()
    return Drain(mode, fires, seconds, cpu_seconds, fires == rows == keys == expected, scrape_ms)


def copy_database(template: Path, to: Path) -> Path:
    for suffix in ("", "-wal"):
        source = template.with_name(template.name + suffix)
        if source.exists():
            shutil.copyfile(source, to.with_name(to.name + suffix))
    return to


def rounds(
    folder: Path,
    template: Path,
    now: int,
    count: int,
    reps: int,
    modes: Sequence[str],
    provider: Any | None,
) -> list[Drain]:
    """`reps` rounds of one drain per mode, rotating which mode goes first."""
    results = []
    for rep in range(reps):
        order = [*modes[rep % len(modes) :], *modes[: rep % len(modes)]]
        for mode in order:
            db = copy_database(template, folder / f"run-{rep}-{mode.replace('+', '-')}.db")
            results.append(drain(db, now, mode, count, provider))
            for leftover in folder.glob(db.name + "*"):
                leftover.unlink()
    return results


def rows_for(label: str, drains: Sequence[Drain], modes: Sequence[str]) -> list[list[str]]:
    by_mode = {m: [d for d in drains if d.mode == m] for m in modes}
    rate = {m: statistics.median(d.per_second for d in ds) for m, ds in by_mode.items()}
    cpu = {m: statistics.median(d.cpu_seconds / d.fires for d in ds) for m, ds in by_mode.items()}
    table = []
    for mode in modes:
        values = [d.per_second for d in by_mode[mode]]
        scrapes = [d.scrape_ms for d in by_mode[mode]]
        table.append(
            [
                f"{label}: {mode}",
                num(by_mode[mode][0].fires),
                f"{num(rate[mode], 0)} ({min(values):,.0f}-{max(values):,.0f})",
                f"{rate[mode] / rate['off']:.3f}",
                num(1e6 / rate[mode] - 1e6 / rate["off"], 2),
                num(1e6 * (cpu[mode] - cpu["off"]), 2),
                "-" if mode == "off" else num(statistics.median(scrapes), 1),
                "yes" if all(d.exact for d in by_mode[mode]) else "NO",
            ]
        )
    return table


def sdk_provider() -> Any:
    """An SDK provider that records every span and exports none (`--sdk`)."""
    sdk = importlib.import_module("opentelemetry.sdk.trace")  # optional: not a dependency
    return sdk.TracerProvider()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller, shorter run")
    parser.add_argument(
        "--sdk", action="store_true", help="trace through an SDK provider (opentelemetry-sdk)"
    )
    args = parser.parse_args()
    quiet_logging()
    count = 10_000 if args.quick else 100_000
    reps = 3 if args.quick else 5
    traced = tracing() is not None
    modes = MODES if traced else MODES[:2]
    provider = sdk_provider() if args.sdk and traced else None
    cpu0, wall0, busy0 = time.process_time(), time.perf_counter(), machine_busy_s()
    table: list[list[str]] = []
    with scratch_dir() as folder:
        now = int(time.time() * 1000)
        templates = [
            (f"{count:,} schedules, 1 due slot each", backlog_of_schedules(folder, count, now)),
            (
                f"{count // 100:,} schedules x 100 missed (each)",
                backlog_of_catch_up(folder, count, now),
            ),
        ]
        for label, template in templates:
            drains = rounds(folder, template, now, count, reps, modes, provider)
            table += rows_for(label, drains, modes)
    others = machine_busy_s() - busy0 - (time.process_time() - cpu0)
    others_share = others / ((time.perf_counter() - wall0) * cores())
    print_table(
        f"Dispatch throughput with metrics and tracing on vs off, {count:,} due slots, "
        f"median of {reps} rounds",
        [
            "backlog: observer",
            "fires",
            "fires/s (range)",
            "ratio to off",
            "µs/fire added",
            "CPU µs/fire added",
            "scrape ms",
            "exactly once",
        ],
        table,
    )
    if not traced:
        print("tracing: opentelemetry-api is not installed (pip install 'vortos[otel]'): skipped")
    elif provider is None:
        print(
            "tracing: the OpenTelemetry API without an SDK: spans are its no-ops (--sdk to record)"
        )
    else:
        print("tracing: an SDK TracerProvider, every span recorded, none exported")
    print(f"other processes used {100 * others_share:.0f}% of the {cores()} cores meanwhile")


if __name__ == "__main__":
    main()
