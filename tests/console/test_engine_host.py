"""The engine beside the console: it stands by while another process leads (and the header
names that leader), takes over when that one stops, and a loop that dies says so."""

from __future__ import annotations

import asyncio
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from engine import Engine, SystemClock, open_engine, open_read_model
from engine.ports.lease import LEADER_LEASE
from tests.integration.processes import Daemon, wait_for
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.context import ConsoleContext, NodeRole
from vortos_tui.console.engine_host import EngineHost
from vortos_tui.console.widgets import ConsoleHeader


def host_on(db: Path) -> tuple[EngineHost, Engine]:
    engine = open_engine(db)
    host = EngineHost(
        engine,
        node_id="console",
        lease_ttl_ms=2000,
        concurrency=1,
        claim_ttl_ms=60_000,
        grace_ms=0,
    )
    return host, engine


@pytest.mark.slow
def test_the_console_engine_stands_by_while_another_process_leads_and_says_who(
    tmp_path: Path,
) -> None:
    db = tmp_path / "vortos.db"
    open_engine(db).close()
    other = Daemon(db, "other-node", tmp_path)
    host, engine = host_on(db)
    try:
        with open_engine(db, readonly=True) as reader:
            wait_for(
                lambda: (
                    (lease := reader.storage.leases.current(LEADER_LEASE)) is not None
                    and lease.holder == "other-node"
                ),
                20,
                "the other process to lead",
            )
        host.start()

        async def header_text() -> str:
            ctx = ConsoleContext(
                db_label="vortos.db",
                model=open_read_model(db),
                clock=SystemClock(),
                zone=ZoneInfo("UTC"),
                operator="alice",
                actions=None,
                node=host.status,
            )
            app = VortosConsole(ctx)
            async with app.run_test(size=(100, 24)):
                await app.settle()
                return str(app.screen.query_one(ConsoleHeader).render())

        text = asyncio.run(header_text())
        assert host.status().role is NodeRole.STANDBY
        assert "node standby" in text
        assert "leader other-node" in text
        assert other.terminate() == 0  # it releases the lease on the way out
        wait_for(lambda: host.status().role is NodeRole.LEADER, 10, "the console to take over")
    finally:
        other.terminate()
        host.stop()
        engine.close()


def test_a_loop_that_dies_on_a_bug_marks_the_node_down_and_stops_the_other(
    tmp_path: Path,
) -> None:
    host, engine = host_on(tmp_path / "vortos.db")

    def broken() -> None:
        raise RuntimeError("a bug")

    host.daemon.run = broken  # type: ignore[method-assign]
    try:
        host.start()
        wait_for(lambda: host.status().role is NodeRole.DOWN, 10, "the node to say it is down")
        assert host.failed == "vortos-daemon"
    finally:
        host.stop()  # the consumer was stopped too: this returns
        engine.close()
