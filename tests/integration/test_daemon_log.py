"""The daemon's log at INFO: a line per fire for a few, one line for a burst (each fire's own
at DEBUG), so that logging does not cost more than dispatching."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.domain.timeutil import MINUTE_MS
from engine.runtime.daemon import LOG_EACH_UP_TO
from tests.conftest import T0
from tests.helpers import settle


@pytest.mark.parametrize("schedules", [3, 40])
def test_a_burst_is_one_info_line_and_a_few_fires_are_one_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, schedules: int
) -> None:
    clock = ManualClock(T0)
    with open_engine(tmp_path / "vortos.db", clock=clock) as engine:
        for n in range(schedules):
            engine.service.create(
                ScheduleSpec(f"s{n}", IntervalTrigger(MINUTE_MS, T0 + MINUTE_MS), "noop"),
                actor="t",
            )
        daemon = engine.daemon(node_id="n", lease_ttl_ms=3_600_000, lookahead_ms=0)
        settle(daemon)
        clock.set(T0 + MINUTE_MS)
        with caplog.at_level(logging.DEBUG, logger="vortos.daemon"):
            settle(daemon)
    fired = [r for r in caplog.records if r.getMessage().startswith("fired ")]
    at_info = [r for r in fired if r.levelno == logging.INFO]
    at_debug = [r for r in fired if r.levelno == logging.DEBUG]
    if schedules <= LOG_EACH_UP_TO:
        assert (len(at_info), len(at_debug)) == (schedules, 0)
    else:
        assert len(at_info) == 1
        assert at_info[0].getMessage().startswith(f"fired {schedules} slot(s) from ")
        assert len(at_debug) == schedules
