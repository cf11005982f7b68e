"""Cells shared by the views: a schedule's state and next fire, a run's timings, facts."""

from __future__ import annotations

from zoneinfo import ZoneInfo

from rich.table import Table
from rich.text import Text

from engine import Run, RunState, Schedule, ScheduleStatus
from engine.domain.schedule import ScheduleOrigin
from engine.governance.deadman import Verdict, judge
from vortos_tui.console.format import (
    duration,
    full_instant,
    in_words,
    instant,
    plain,
    state_text,
)

Cells = tuple[Text | str, ...]


def overdue(schedule: Schedule, last_slot_at: int | None, now_ms: int) -> bool:
    """The dead-man detector's verdict (see engine.governance.deadman): it has not fired as
    often as its trigger says."""
    if schedule.status is not ScheduleStatus.ACTIVE or schedule.next_slot_at is None:
        return False
    return judge(schedule, last_slot_at, now_ms).verdict in (Verdict.OVERDUE, Verdict.NEVER_FIRED)


def badges(schedule: Schedule, *, late: bool = False) -> Text:
    text = state_text(schedule.status.value)
    if late:
        text.append(" ")
        text.append("LATE", style="bold reverse red")
    if schedule.override is not None:
        # An operator's pause or resume of a code-declared schedule, kept across deploys.
        text.append(" ")
        text.append("OVR", style="bold reverse yellow")
    if schedule.sensitive:
        text.append(" ")
        text.append("SENS", style="bold reverse red")
    return text


def override_facts(schedule: Schedule, zone: ZoneInfo) -> list[tuple[str, str]]:
    """A static schedule's declared state and an operator's override of it."""
    if schedule.origin is not ScheduleOrigin.STATIC:
        return []
    found = [("declared", f"{schedule.declared_status.value} (in code)")]
    if schedule.override is not None:
        o = schedule.override
        found.append(
            (
                "override",
                f"{o.state.value} by {o.by}, {full_instant(o.at, zone)}"
                + (f": {o.note}" if o.note else "")
                + " (kept across deploys until cleared)",
            )
        )
    return found


def name_cell(schedule: Schedule) -> Text:
    return Text(schedule.name, overflow="ellipsis", no_wrap=True)


def next_fire(schedule: Schedule, now_ms: int, zone: ZoneInfo) -> tuple[str, str]:
    if schedule.status is not ScheduleStatus.ACTIVE:
        return "-", schedule.status.value
    if schedule.next_fire_at is None:
        return "-", "finished"
    return instant(schedule.next_fire_at, zone, now_ms), in_words(schedule.next_fire_at - now_ms)


def lateness(run: Run, now_ms: int) -> Text:
    """How late the command started after its due instant (still waiting: late so far)."""
    if run.started_at is not None:
        return Text(duration(max(0, run.started_at - run.due_at)))
    if run.state is RunState.DISPATCHED and now_ms > run.due_at:
        return Text(duration(now_ms - run.due_at), style="italic yellow")
    return Text("-", style="dim")


def run_duration(run: Run, now_ms: int) -> Text:
    if run.started_at is None:
        return Text("-", style="dim")
    if run.finished_at is None:
        return Text(duration(max(0, now_ms - run.started_at)), style="italic blue")
    return Text(duration(max(0, run.finished_at - run.started_at)))


def fire_cells(run: Run, now_ms: int, zone: ZoneInfo) -> Cells:
    return (
        instant(run.slot_at, zone, now_ms),
        Text(run.schedule_name, overflow="ellipsis", no_wrap=True),
        state_text(run.state.value),
        lateness(run, now_ms),
        str(run.attempts),
        run_duration(run, now_ms),
        run.consumer or "-",
        run.kind.value,
        run.tenant,
        str(run.id),
    )


def facts(rows: list[tuple[str, Text | str]]) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        # One line per fact: a newline in a note must not start a forged fact.
        grid.add_row(label, plain(value, one_line=True))
    return grid
