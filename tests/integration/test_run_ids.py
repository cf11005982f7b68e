"""A run id names one run forever: SQLite would hand out a deleted largest id again (an edit
withdrew the newest run unrun, or retention pruned every run), and audit entries name runs by
id, so the largest id ever used is kept (run_id_floor) and new runs start above it."""

from __future__ import annotations

from pathlib import Path

import apsw

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.domain.timeutil import MINUTE_MS
from engine.ports import RunQuery
from tests.conftest import T0


def test_ids_of_deleted_runs_are_never_handed_out_again(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="alice"
        )
        first = [engine.service.trigger("report", actor="bob").id for _ in range(3)]
    conn = apsw.Connection(str(db))
    try:  # every run gone, as after a retention sweep of a quiet database
        conn.execute("DELETE FROM fire_queue; DELETE FROM runs")
    finally:
        conn.close()
    with open_engine(db, clock=clock) as engine:
        manual = engine.service.trigger("report", actor="bob").id
        clock.advance(3600)
        daemon = engine.daemon(node_id="n", lease_ttl_ms=3_600_000, lookahead_ms=0)
        daemon.step()
        daemon.step()
        dispatched = [r.id for r in engine.service.runs(RunQuery(limit=10)) if r.id != manual]
    assert manual == max(first) + 1
    assert dispatched
    assert min(dispatched) > manual
