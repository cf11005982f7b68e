"""The testing kit (engine.testing): the real engine on a temporary file and a manual clock,
moved from due instant to due instant, and assertions that say what differed."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import ModuleType
from zoneinfo import ZoneInfo

import pytest

from engine import (
    CronTrigger,
    FireContext,
    IntervalTrigger,
    InvalidInput,
    OneShotTrigger,
    RepeatedHour,
    RetryPolicy,
    RunKind,
    RunState,
    ScheduleSpec,
    schedulable,
    scheduled,
)
from engine.domain.timeutil import MINUTE_MS, parse_instant
from engine.testing import ManualClock, SchedulerHarness, scheduler_harness

MONDAY = "2026-01-05T00:00:00Z"


@scheduled(cron="30 2 * * *", timezone="Europe/Berlin", payload={"to": "ops"})
@schedulable("nightly-report")
def nightly_report(to: str) -> str:
    return f"report sent to {to}"


@schedulable("send-report")
def send_report(to: str, cc: str | None = None) -> str:
    return f"sent to {to}" + (f" cc {cc}" if cc else "")


def berlin_nights(first: int, last: int, month: str = "2026-01") -> list[str]:
    return [f"{month}-{day:02d}T02:30:00+01:00" for day in range(first, last + 1)]


def one_shot(name: str, at: str, command: str, **extra: object) -> ScheduleSpec:
    return ScheduleSpec(
        name=name,
        trigger=OneShotTrigger(parse_instant(at)),
        command=command,
        **extra,  # type: ignore[arg-type]
    )


# -- fire instants -------------------------------------------------------------------------


def test_a_static_cron_schedule_fires_at_its_local_times_over_a_week() -> None:
    with scheduler_harness(commands=[nightly_report], start=MONDAY) as h:
        h.assert_fires_at("nightly-report", berlin_nights(5, 11), within="7d")
        assert h.now == datetime(2026, 1, 12, tzinfo=UTC)


def test_a_static_cron_schedule_over_the_spring_forward_fires_in_the_shifted_hour() -> None:
    with scheduler_harness(commands=[nightly_report], start="2026-03-23T00:00:00Z") as h:
        h.assert_fires_at(
            "nightly-report",
            [*berlin_nights(23, 28, "2026-03"), "2026-03-29T03:30:00+02:00"],
            within="7d",
        )


def test_a_static_cron_schedule_over_the_fall_back_fires_in_the_first_pass() -> None:
    with scheduler_harness(commands=[nightly_report], start="2026-10-19T00:00:00Z") as h:
        expected = [f"2026-10-{day}T02:30:00+02:00" for day in range(19, 26)]
        h.assert_fires_at("nightly-report", expected, within="7d")


def test_both_passes_of_a_repeated_hour_fire_when_the_schedule_asks_for_both() -> None:
    with scheduler_harness(start="2026-10-24T22:00:00Z") as h:
        h.service.create(
            ScheduleSpec(
                name="hourly",
                trigger=CronTrigger("0 * * * *", repeated=RepeatedHour.BOTH),
                command="noop",
                timezone="Europe/Berlin",
            ),
            actor="test",
        )
        h.assert_fires_at(
            "hourly",
            [
                "2026-10-25T00:00:00+02:00",
                "2026-10-25T01:00:00+02:00",
                "2026-10-25T02:00:00+02:00",
                "2026-10-25T02:00:00+01:00",
                "2026-10-25T03:00:00+01:00",
                "2026-10-25T04:00:00+01:00",
            ],
            within="5h",
        )


def test_expected_instants_without_an_offset_are_wall_times_in_the_schedule_zone() -> None:
    with scheduler_harness(commands=[nightly_report], start=MONDAY) as h:
        berlin = ZoneInfo("Europe/Berlin")
        h.assert_fires_at(
            "nightly-report",
            ["2026-01-05T02:30:00", datetime(2026, 1, 6, 2, 30, tzinfo=berlin)],
            within=timedelta(days=2),
        )
        assert h.fires("nightly-report") == [
            datetime(2026, 1, 5, 2, 30, tzinfo=berlin),
            datetime(2026, 1, 6, 2, 30, tzinfo=berlin),
        ]


def test_an_interval_schedule_in_a_tenant_fires_every_interval_from_its_anchor() -> None:
    with scheduler_harness(start=MONDAY) as h:
        h.service.create(
            ScheduleSpec(
                name="poll-feeds",
                trigger=IntervalTrigger(15 * MINUTE_MS, parse_instant(MONDAY)),
                command="noop",
                tenant="acme",
            ),
            actor="test",
        )
        # Due at the start itself: a slot due now that has not fired yet counts.
        h.assert_fires_at(
            "poll-feeds",
            ["2026-01-05T00:00:00Z", "2026-01-05T00:15:00Z", "2026-01-05T00:30:00Z"],
            within="30m",
            tenant="acme",
        )
        h.assert_fires_at(
            "poll-feeds",
            ["2026-01-05T00:45:00Z", "2026-01-05T01:00:00Z"],
            within="30m",
            tenant="acme",
        )
        assert {r.tenant for r in h.runs("poll-feeds")} == {"acme"}


def test_a_static_every_schedule_fires_on_its_epoch_aligned_slots() -> None:
    @scheduled(every="30m")
    @schedulable("heartbeat")
    def heartbeat() -> None:
        return None

    with scheduler_harness(commands=[heartbeat], start="2026-01-05T00:10:00Z") as h:
        h.assert_fires_at(
            "heartbeat", ["2026-01-05T00:30:00Z", "2026-01-05T01:00:00Z"], within="1h"
        )


def test_a_one_shot_fires_once_and_never_again() -> None:
    with scheduler_harness(commands=[send_report], start=MONDAY) as h:
        h.service.create(
            one_shot("quarterly", "2026-01-05T09:00:00Z", "send-report", payload={"to": "ops"}),
            actor="test",
        )
        h.assert_fires_at("quarterly", ["2026-01-05T09:00:00Z"], within="1d")
        h.assert_fires_at("quarterly", [], within="30d")
        run = h.assert_ran_once("send-report", {"to": "ops"})
        assert run.slot_at == datetime(2026, 1, 5, 9, tzinfo=UTC)
        assert run.output == "sent to ops"


def test_a_simulated_year_jumps_from_slot_to_slot() -> None:
    with scheduler_harness(start=MONDAY) as h:
        h.service.create(
            ScheduleSpec(name="weekly", trigger=CronTrigger("0 9 * * 1"), command="noop"),
            actor="test",
        )
        started = time.perf_counter()
        h.advance("364d")
        # Second by second, a year would be 31 million steps.
        assert time.perf_counter() - started < 10
        assert len(h.fires("weekly")) == 52


def test_time_never_moves_back() -> None:
    with (
        scheduler_harness(start=MONDAY) as h,
        pytest.raises(InvalidInput, match="before the harness's clock"),
    ):
        h.run_until("2026-01-04T00:00:00Z")


# -- runs and payloads ---------------------------------------------------------------------


def test_a_command_ran_once_with_its_payload() -> None:
    with scheduler_harness(commands=[send_report], start=MONDAY) as h:
        h.service.create(
            one_shot("to-ops", "2026-01-05T08:00:00Z", "send-report", payload={"to": "ops"}),
            actor="test",
        )
        h.service.create(
            one_shot(
                "to-dev",
                "2026-01-05T08:00:00Z",
                "send-report",
                payload={"to": "dev", "cc": "ops"},
            ),
            actor="test",
        )
        h.run_until("2026-01-05T12:00:00Z")
        run = h.assert_ran_once(send_report, {"to": "dev", "cc": "ops"})
        assert (run.schedule, run.state, run.output) == (
            "to-dev",
            RunState.COMPLETED,
            "sent to dev cc ops",
        )
        h.assert_ran_once("send-report", {"to": "ops"})


def test_a_failing_command_is_retried_after_its_backoff_and_the_retry_shows() -> None:
    attempts: list[tuple[int, int]] = []  # attempt, the harness's clock when it ran
    clock: list[ManualClock] = []

    @schedulable("flaky-export")
    def flaky_export(*, fire: FireContext) -> str:
        attempts.append((fire.attempt, clock[0].now_ms()))
        if fire.attempt == 1:
            raise RuntimeError("the export server said no")
        return "exported"

    with scheduler_harness(commands=[flaky_export], start=MONDAY) as h:
        clock.append(h.clock)
        retry = RetryPolicy(max_attempts=3, backoff_ms=10_000)
        h.service.create(
            one_shot("export", "2026-01-05T09:00:00Z", "flaky-export", retry=retry),
            actor="test",
        )
        h.advance("10h")
        (run,) = h.runs("export")
        assert (run.state, run.attempts, run.output) == (RunState.COMPLETED, 2, "exported")
        slot = parse_instant("2026-01-05T09:00:00Z")
        assert [a for a, _ in attempts] == [1, 2]
        assert attempts[0][1] == slot
        # The backoff plus at most a quarter of it as jitter.
        assert 10_000 <= attempts[1][1] - slot <= 12_500
        h.assert_ran_once("flaky-export")


def test_a_command_that_keeps_failing_is_dead_lettered() -> None:
    @schedulable("broken")
    def broken() -> None:
        raise RuntimeError("disk full")

    with scheduler_harness(commands=[broken], start=MONDAY) as h:
        retry = RetryPolicy(max_attempts=2, backoff_ms=1_000)
        h.service.create(one_shot("b", "2026-01-05T01:00:00Z", "broken", retry=retry), actor="t")
        h.advance("1d")
        (run,) = h.runs(command=broken)
        assert (run.state, run.attempts) == (RunState.DEAD_LETTERED, 2)
        assert run.error is not None
        assert "disk full" in run.error


def test_runs_filter_by_schedule_command_and_state_oldest_first() -> None:
    with scheduler_harness(commands=[nightly_report, send_report], start=MONDAY) as h:
        h.service.create(
            one_shot("ad-hoc", "2026-01-05T12:00:00Z", "send-report", payload={"to": "x"}),
            actor="test",
        )
        h.service.trigger("nightly-report", actor="test")
        h.advance("2d")
        nightly = h.runs("nightly-report")
        assert [r.kind for r in nightly] == [RunKind.MANUAL, RunKind.SCHEDULED, RunKind.SCHEDULED]
        assert [r.id for r in nightly] == sorted(r.id for r in nightly)
        assert [r.schedule for r in h.runs(command="send-report")] == ["ad-hoc"]
        assert len(h.runs(state=RunState.COMPLETED)) == 4
        # Manual runs are not slots of the trigger.
        assert len(h.fires("nightly-report")) == 2


def test_an_app_module_brings_its_commands_and_static_schedules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = ModuleType("kit_app_jobs")

    @scheduled(cron="0 6 * * *", payload={"region": "eu"})
    @schedulable("billing.send-invoices")
    def send_invoices(region: str, dry_run: bool = False) -> str:
        return f"invoices for {region}{' (dry run)' if dry_run else ''}"

    module.send_invoices = send_invoices  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with scheduler_harness(app=module, start=MONDAY) as h:
        h.assert_fires_at("billing.send-invoices", ["2026-01-05T06:00:00Z"], within="1d")
        assert h.assert_ran_once("billing.send-invoices", {"region": "eu"}).output == (
            "invoices for eu"
        )


# -- assertions that fail say what differed ------------------------------------------------


@pytest.fixture
def nightly() -> Iterator[SchedulerHarness]:
    with scheduler_harness(commands=[nightly_report, send_report], start=MONDAY) as h:
        yield h


def test_assert_fires_at_lists_what_is_missing_and_what_was_unexpected(
    nightly: SchedulerHarness,
) -> None:
    expected = [*berlin_nights(5, 6), "2026-01-07T03:30:00+01:00", *berlin_nights(8, 11)]
    with pytest.raises(AssertionError) as failed:
        nightly.assert_fires_at("nightly-report", expected, within="7d")
    message = str(failed.value)
    assert "default/nightly-report (Europe/Berlin) fired 7 time(s)" in message
    assert "missing (expected, did not fire): 2026-01-07T03:30:00+01:00" in message
    assert "unexpected (fired, not expected): 2026-01-07T02:30:00+01:00" in message
    assert "actual:   2026-01-05T02:30:00+01:00, 2026-01-06T02:30:00+01:00" in message


def test_assert_fires_at_fails_when_fewer_fire_than_expected(nightly: SchedulerHarness) -> None:
    with pytest.raises(AssertionError, match=r"fired 2 time\(s\) .*expected 3"):
        nightly.assert_fires_at("nightly-report", berlin_nights(5, 7), within="2d")


def test_assert_fires_at_fails_when_more_fire_than_expected(nightly: SchedulerHarness) -> None:
    with pytest.raises(
        AssertionError,
        match=r"(?s)fired 2 time\(s\).*expected 1.*unexpected .*: 2026-01-06T02:30:00\+01:00",
    ):
        nightly.assert_fires_at("nightly-report", berlin_nights(5, 5), within="2d")


def test_assert_ran_once_names_the_payloads_that_ran_instead(nightly: SchedulerHarness) -> None:
    nightly.service.create(
        one_shot("r", "2026-01-05T08:00:00Z", "send-report", payload={"to": "dev"}), actor="t"
    )
    nightly.advance("1d")
    with pytest.raises(AssertionError) as failed:
        nightly.assert_ran_once("send-report", {"to": "ops"})
    message = str(failed.value)
    assert (
        "command 'send-report' completed 0 time(s) with payload {'to': 'ops'}, "
        "expected exactly once" in message
    )
    assert "1 completed with {'to': 'dev'}" in message
    assert "run 2 of default/r (scheduled, slot 2026-01-05T08:00:00+00:00)" in message


def test_assert_ran_once_says_how_many_times_it_ran(nightly: SchedulerHarness) -> None:
    nightly.advance("3d")
    with pytest.raises(
        AssertionError,
        match=r"(?s)'nightly-report' completed 3 time\(s\) with payload \{'to': 'ops'\}.*"
        r"3 completed with \{'to': 'ops'\}",
    ):
        nightly.assert_ran_once(nightly_report, {"to": "ops"})


def test_assert_ran_once_says_when_the_command_never_ran(nightly: SchedulerHarness) -> None:
    nightly.advance("1d")
    with pytest.raises(
        AssertionError,
        match=r"'send-report' completed 0 time\(s\), expected exactly once: it never ran "
        r"\(commands that ran: nightly-report\)",
    ):
        nightly.assert_ran_once("send-report")


def test_assert_ran_once_counts_a_dead_letter_as_not_completed() -> None:
    @schedulable("broken")
    def broken() -> None:
        raise RuntimeError("disk full")

    with scheduler_harness(commands=[broken], start=MONDAY) as h:
        retry = RetryPolicy(max_attempts=1)
        h.service.create(one_shot("b", "2026-01-05T01:00:00Z", "broken", retry=retry), actor="t")
        h.advance("1h")
        with pytest.raises(
            AssertionError,
            match=r"(?s)completed 0 time\(s\).*1 dead_lettered with \{\}.*error: .*disk full",
        ):
            h.assert_ran_once("broken")


def test_an_unmarked_function_is_refused_with_what_to_do() -> None:
    def plain() -> None:
        return None

    with (
        pytest.raises(InvalidInput, match="not a command: mark it @schedulable"),
        scheduler_harness(commands=[plain], start=MONDAY),
    ):
        pass
