"""The console with a control socket: its verbs, decisions and verification are made by the
socket's server, as the console's account; the console itself only reads the database."""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec, ScheduleStatus, open_engine
from engine.control import RemoteService
from engine.domain.access import Grant, Role
from engine.domain.audit import tenant_chain
from engine.domain.timeutil import MINUTE_MS
from tests.conftest import T0
from vortos_tui.console.actions import ConsoleActions, ScheduleRef, Verb

ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    db = tmp_path / "vortos.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as trusted:
        trusted.service.create(
            ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop", tenant="ops"),
            actor="setup",
        )
        trusted.storage.operators.grant(Grant(ME, Role.OPERATOR, "ops"), by="setup", at=T0)
    with (
        tempfile.TemporaryDirectory(prefix="vt-") as where,
        open_engine(db, clock=clock, enforce=True) as server,
    ):
        path = Path(where) / "control.sock"
        with server.serve_control(path):
            yield db, path


def test_console_verbs_and_verification_go_through_the_socket(
    served: tuple[Path, Path],
) -> None:
    db, path = served
    actions = ConsoleActions(
        lambda: open_engine(db, create=False, enforce=True, control_socket=path), ME
    )
    try:
        with open_engine(db, create=False, readonly=True) as reader:
            report = reader.storage.schedules.find_by_name("ops", "report")
        assert report is not None
        said = actions.perform(Verb.PAUSE, ScheduleRef.of(report))
        assert "paused" in said
        assert isinstance(actions._service_engine().service, RemoteService)
        with open_engine(db, create=False, readonly=True) as reader:
            entry = reader.storage.audit.latest(tenant_chain("ops"), limit=1)[0]
            paused = reader.storage.schedules.find_by_name("ops", "report")
        assert (entry.event, entry.actor) == ("schedule.paused", ME)
        assert paused is not None
        assert paused.status is ScheduleStatus.PAUSED
        verified = actions.verify_audit()
        assert [r.chain for r in verified.chains] == [tenant_chain("ops")]
        assert verified.intact
    finally:
        actions.close()
