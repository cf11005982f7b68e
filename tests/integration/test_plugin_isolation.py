"""Acceptance 3 of the plug-ins issue: an audit sink that raises on every call and one that
hangs (and metrics backends that do the same): fires continue on time, the failures are counted
and reported by doctor. And the healthy case: a working sink receives every audit entry, in
order, and doctor's plugins.health passes.

Real processes throughout: `vortos run --metrics-port` with the plug-ins named by dotted path in
a vortos.toml, a plug-in module written here and put on the process's PYTHONPATH, `vortos
doctor --json` beside it, the Prometheus endpoint scraped over HTTP.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import textwrap
import time
import urllib.error
import urllib.request
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import IntervalTrigger, ScheduleSpec, open_engine
from engine.domain.audit import AuditEntry
from tests.conftest import run_cli
from tests.integration.processes import Daemon, wait_for

pytestmark = pytest.mark.slow

MODULE = "isoplugins"
RAISING_SINK = f"{MODULE}:RaisingSink"
HANGING_SINK = f"{MODULE}:HangingSink"
FILE_SINK = f"{MODULE}:FileSink"
RAISING_METRICS = f"{MODULE}:RaisingMetrics"
HANGING_METRICS = f"{MODULE}:HangingMetrics"
COUNTING_METRICS = f"{MODULE}:CountingMetrics"

SCHEDULES = 5  # every second each
WINDOW_S = 10  # seconds of slots judged in the failing run
DISPATCH_P99_MS = 250  # dispatched this late at most (p99); on an idle machine: a few ms
COMPLETED_P99_MS = 500  # and completed (a noop) this late at most
LATEST_MS = 1_000  # no slot at all later than this

PLUGINS = '''
"""Plug-ins for the isolation test: sinks and metrics backends that raise, hang, or work."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.extend import AuditEntry, MetricsObserver, PluginContext

NEVER = threading.Event()  # never set: a call waiting on it never returns


class RaisingSink:
    def __init__(self, context: PluginContext) -> None:
        pass

    def deliver(self, entries: Sequence[AuditEntry]) -> None:
        raise ConnectionError("the SIEM refused the batch")

    def close(self) -> None:
        pass


class HangingSink:
    def __init__(self, context: PluginContext) -> None:
        pass

    def deliver(self, entries: Sequence[AuditEntry]) -> None:
        NEVER.wait()

    def close(self) -> None:
        pass


class FileSink:
    """Appends each delivered entry, as JSON, one per line (no skipping of repeats: the test
    sees exactly what was delivered)."""

    def __init__(self, context: PluginContext) -> None:
        self.path = Path(context.options["path"])

    def deliver(self, entries: Sequence[AuditEntry]) -> None:
        with self.path.open("a") as file:
            for entry in entries:
                file.write(json.dumps(entry.to_json()) + "\\n")
            file.flush()
            os.fsync(file.fileno())

    def close(self) -> None:
        pass


def _raise(self: Any, *args: Any, **kwargs: Any) -> None:
    raise RuntimeError("the metrics agent is down")


def _hang(self: Any, *args: Any, **kwargs: Any) -> None:
    NEVER.wait()


class RaisingMetrics(MetricsObserver):
    def __init__(self, context: PluginContext) -> None:
        pass


class HangingMetrics(MetricsObserver):
    def __init__(self, context: PluginContext) -> None:
        pass


# Every hook of the port, in both.
for _hook, _value in list(vars(MetricsObserver).items()):
    if callable(_value) and not _hook.startswith("_"):
        setattr(RaisingMetrics, _hook, _raise)
        setattr(HangingMetrics, _hook, _hang)


class CountingMetrics(MetricsObserver):
    """Writes a line per dispatch transaction it hears of."""

    def __init__(self, context: PluginContext) -> None:
        self.path = Path(context.options["path"])

    def dispatched(self, report: Any, facts: Any) -> None:
        with self.path.open("a") as file:
            file.write(f"{len(report.dispatched)}\\n")
'''


@dataclass
class Site:
    """A database with schedules due every second, the plug-in module, and a vortos.toml."""

    db: Path
    config: Path
    env: dict[str, str]
    log_dir: Path


def site(tmp_path: Path, name: str, settings: str) -> Site:
    folder = tmp_path / name
    folder.mkdir()
    modules = tmp_path / "plugins"
    if not modules.exists():
        modules.mkdir()
        (modules / f"{MODULE}.py").write_text(PLUGINS)
    db = folder / "vortos.db"
    with open_engine(db) as engine:
        for n in range(SCHEDULES):
            spec = ScheduleSpec(name=f"tick-{n}", trigger=IntervalTrigger(1000, 0), command="noop")
            engine.service.create(spec, actor="ops")
    config = folder / "vortos.toml"
    config.write_text(textwrap.dedent(settings))
    path = [str(modules), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {"VORTOS_CONFIG": str(config), "PYTHONPATH": os.pathsep.join(path)}
    return Site(db, config, env, folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def failures(port: int, *, zeros: bool = False) -> dict[tuple[str, str, str], float]:
    """vortos_plugin_failures_total by (port, plugin, reason), as served now: the series that
    counted something (with `zeros`, every series, each selected plug-in's starting at 0)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return {}
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vortos_plugin_failures_total" and (zeros or s.value):
                found[(s.labels["port"], s.labels["plugin"], s.labels["reason"])] = s.value
    return found


def doctor(where: Site) -> dict[str, dict[str, str]]:
    """`vortos doctor --json` in a process of its own: check id -> finding."""
    result = run_cli("doctor", "--json", db=where.db, env=where.env)
    assert result.stdout, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return {f["check_id"]: f for f in report["findings"]}


def query(db: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return list(conn.execute(sql, args))


def p99(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, (len(ordered) * 99) // 100)]


def now_ms() -> int:
    return int(time.time() * 1000)


def audit_tips(db: Path) -> dict[str, int]:
    return dict(query(db, "SELECT chain, max(seq) FROM audit_entries GROUP BY chain"))


def copied(path: Path) -> list[AuditEntry]:
    if not path.exists():
        return []
    return [AuditEntry.from_json(json.loads(line)) for line in path.read_text().splitlines()]


def caught_up(copy: Path, tips: dict[str, int]) -> bool:
    held: dict[str, int] = {}
    for entry in copied(copy):
        held[entry.chain] = max(held.get(entry.chain, 0), entry.seq)
    return all(held.get(chain, 0) >= seq for chain, seq in tips.items())


def assert_copy_is_the_chains(copy: Path, db: Path, tips: dict[str, int]) -> None:
    """The copy holds each chain's entries from seq 1, consecutive, in order, each exactly as
    the database holds it, at least up to `tips` (a batch may come twice only after a failed
    acknowledgement: none here, so none does)."""
    entries = copied(copy)
    with open_engine(db, create=False, readonly=True) as engine:
        chains = set(engine.storage.audit.chains())
        assert {e.chain for e in entries} <= chains, "the copy holds a chain the database has not"
        for chain, tip in tips.items():
            mine = [e for e in entries if e.chain == chain]
            assert [e.seq for e in mine] == list(range(1, len(mine) + 1)), (
                f"chain {chain}: the copy's sequence numbers are not 1, 2, 3...: "
                f"{[e.seq for e in mine]}"
            )
            assert len(mine) >= tip, f"chain {chain}: copied up to {len(mine)} of {tip}"
            stored = engine.storage.audit.entries(chain, after_seq=0, limit=len(mine))
            assert mine == list(stored), f"chain {chain}: the copy differs from the database"


def assert_every_slot_on_time(db: Path, lo: int, hi: int) -> None:
    """Every schedule has a run for every slot in [lo, hi], dispatched and completed on time."""
    rows = query(
        db,
        "SELECT schedule_name, slot_at, dispatched_at - due_at, finished_at - due_at, state "
        "FROM runs WHERE kind = 'scheduled' AND slot_at BETWEEN ? AND ? "
        "AND schedule_name LIKE 'tick-%'",
        lo,
        hi,
    )
    expected = list(range(lo, hi + 1, 1000))
    assert len(expected) >= WINDOW_S - 1, (lo, hi)
    for n in range(SCHEDULES):
        slots = sorted(r[1] for r in rows if r[0] == f"tick-{n}")
        missed = sorted(set(expected) - set(slots))
        assert slots == expected, f"tick-{n}: slots missed {missed}, found {slots}"
    unfinished = [r for r in rows if r[4] != "completed"]
    assert not unfinished, f"runs not completed: {unfinished}"
    dispatched = [r[2] for r in rows]
    completed = [r[3] for r in rows]
    shown = f"dispatch p99 {p99(dispatched)} ms max {max(dispatched)} ms; completed p99 " + (
        f"{p99(completed)} ms max {max(completed)} ms over {len(rows)} slots"
    )
    assert p99(dispatched) < DISPATCH_P99_MS, shown
    assert p99(completed) < COMPLETED_P99_MS, shown
    assert max(completed) < LATEST_MS, shown


def test_failing_sinks_and_metrics_never_delay_a_fire_and_are_counted_and_reported(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "copy.jsonl"
    where = site(
        tmp_path,
        "failing",
        f"""
        audit_sinks = ["{RAISING_SINK}", "{HANGING_SINK}", "{FILE_SINK}"]
        metrics = ["{RAISING_METRICS}", "{HANGING_METRICS}"]
        plugin_timeout = "1s"

        [plugin."{FILE_SINK}"]
        path = "{copy}"
        """,
    )
    port = free_port()
    daemon = Daemon(
        where.db, "n1", where.log_dir, args=["--metrics-port", str(port)], env=where.env
    )
    try:
        counted: dict[tuple[str, str, str], float] = {}

        def every_failure_counted() -> bool:
            nonlocal counted
            assert daemon.process.poll() is None, daemon.log
            counted = failures(port)
            return all(
                counted.get(key, 0) >= 1
                for key in (
                    ("audit_sinks", RAISING_SINK, "error"),
                    ("audit_sinks", HANGING_SINK, "timeout"),
                    ("metrics", RAISING_METRICS, "error"),
                    ("metrics", HANGING_METRICS, "timeout"),
                )
            )

        # Hung calls are counted by the health reporter, every 5 s.
        try:
            wait_for(every_failure_counted, 30, "every failing plug-in's failure to be counted")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; counted: {counted}") from None
        assert not any(key[1] == FILE_SINK for key in counted), counted
        assert not any(
            key[2] == "timeout" for key in counted if key[1] in (RAISING_SINK, RAISING_METRICS)
        ), counted
        assert not any(
            key[2] == "error" for key in counted if key[1] in (HANGING_SINK, HANGING_METRICS)
        ), counted

        findings = doctor(where)
        health = findings["plugins.health"]
        assert health["status"] == "warn", health
        troubles = health["detail"].splitlines()
        for name in (RAISING_SINK, HANGING_SINK, RAISING_METRICS, HANGING_METRICS):
            assert any(name in line for line in troubles), f"{name} not reported: {health}"
        assert not any(FILE_SINK in line for line in troubles), health
        assert any(HANGING_SINK in line and "hung" in line for line in troubles), health
        assert any(
            RAISING_SINK in line and "ConnectionError: the SIEM refused the batch" in line
            for line in troubles
        ), health
        assert any(
            RAISING_METRICS in line and "RuntimeError: the metrics agent is down" in line
            for line in troubles
        ), health
        ports = findings["plugins.ports"]
        assert ports["status"] == "pass", ports
        for name in (RAISING_SINK, HANGING_SINK, FILE_SINK, RAISING_METRICS, HANGING_METRICS):
            assert f"{name} (dotted path: {name})" in ports["detail"], ports

        first = query(where.db, "SELECT min(dispatched_at) FROM runs")[0][0]
        assert first is not None
        lo = (first // 1000 + 2) * 1000  # from the second whole second after it led
        wait_for(
            lambda: now_ms() > lo + WINDOW_S * 1000 + 500,
            WINDOW_S + 30,
            f"{WINDOW_S} s of slots",
            every=0.1,
        )
        hi = (now_ms() // 1000 - 1) * 1000  # the last slot due a full second ago
        tips = audit_tips(where.db)
        wait_for(lambda: caught_up(copy, tips), 15, "the working sink to catch up")
    finally:
        assert daemon.terminate() == 0, daemon.log

    assert_every_slot_on_time(where.db, lo, hi)
    assert_copy_is_the_chains(copy, where.db, tips)


def test_a_working_sink_gets_every_entry_in_order_and_doctor_passes(tmp_path: Path) -> None:
    copy, counts = tmp_path / "copy.jsonl", tmp_path / "dispatches.txt"
    where = site(
        tmp_path,
        "healthy",
        f"""
        audit_sinks = ["{FILE_SINK}"]
        metrics = ["{COUNTING_METRICS}"]
        plugin_timeout = "1s"

        [plugin."{FILE_SINK}"]
        path = "{copy}"

        [plugin."{COUNTING_METRICS}"]
        path = "{counts}"
        """,
    )
    port = free_port()
    daemon = Daemon(
        where.db, "n2", where.log_dir, args=["--metrics-port", str(port)], env=where.env
    )
    try:
        wait_for(
            lambda: bool(query(where.db, "SELECT 1 FROM plugin_health WHERE node_id = 'n2'")),
            30,
            "the first plug-in health report",
        )
        tips = audit_tips(where.db)
        wait_for(lambda: caught_up(copy, tips), 15, "the sink to catch up")
        findings = doctor(where)
        assert failures(port) == {}
        assert ("audit_sinks", FILE_SINK, "error") in failures(port, zeros=True), (
            "a selected plug-in's series start at zero"
        )
    finally:
        assert daemon.terminate() == 0, daemon.log

    health = findings["plugins.health"]
    assert health["status"] == "pass", health
    assert FILE_SINK in health["summary"], health
    assert COUNTING_METRICS in health["summary"], health
    assert findings["plugins.ports"]["status"] == "pass", findings["plugins.ports"]
    assert_copy_is_the_chains(copy, where.db, tips)
    assert counts.exists(), "the metrics plug-in heard of no dispatch"
    assert sum(int(n) for n in counts.read_text().split()) >= SCHEDULES
