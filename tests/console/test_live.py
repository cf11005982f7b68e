"""Acceptance: on a fresh database with the demo schedules, the console (with its in-process
engine, as `vortos-tui --demo` runs it) shows fires arriving within a second of their slot."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from engine import SystemClock, builtin_commands, open_engine, open_read_model
from vortos_tui.cli.demo import demo_commands, seed_demo
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.context import ConsoleContext
from vortos_tui.console.engine_host import EngineHost
from vortos_tui.console.views.fires import FiresView

FIRES_TO_WATCH = 4


@pytest.mark.slow
async def test_demo_fires_show_up_live_within_a_second_of_their_slot(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    engine = open_engine(db, commands=demo_commands(builtin_commands()))
    seed_demo(engine, "alice")
    host = EngineHost(
        engine, node_id="here", lease_ttl_ms=5000, concurrency=4, claim_ttl_ms=60_000, grace_ms=0
    )
    ctx = ConsoleContext(
        db_label="vortos.db",
        model=open_read_model(db),
        clock=SystemClock(),
        zone=ZoneInfo("UTC"),
        operator="alice",
        actions=None,
        node=host.status,
        start_view="fires",
    )
    app = VortosConsole(ctx)
    seen: dict[int, int] = {}  # run id -> wall-clock ms when the view first showed it
    slots: dict[int, int] = {}
    host.start()
    try:
        async with app.run_test(size=(160, 48)):
            deadline = time.monotonic() + 30
            first: set[int] | None = None  # shown by the first frame: arrived before it
            while first is None or len(seen) - len(first) < FIRES_TO_WATCH:
                assert time.monotonic() < deadline, f"only {len(seen)} fires shown in 30 s"
                await asyncio.sleep(0.02)  # the console's own refresh (500 ms) does the reading
                view = app.screen
                if not isinstance(view, FiresView) or not view.loaded:
                    continue
                now = int(time.time() * 1000)
                for key in view.table.rows:
                    run_id = int(str(key.value))
                    if run_id not in seen:
                        seen[run_id] = now
                if first is None:
                    first = set(seen)
            detail = await asyncio.gather(*(ctx.model.run(run_id) for run_id in seen))
            for found in detail:
                assert found is not None
                slots[found.run.id] = found.run.slot_at
    finally:
        host.stop()
        engine.close()
    assert first is not None
    arrived = {rid: at for rid, at in seen.items() if rid not in first}
    late = {rid: arrived[rid] - slots[rid] for rid in arrived}
    assert all(ms < 1000 for ms in late.values()), late
