"""Schedules and runs as JSON objects and table rows."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from engine import CronTrigger, Fire, Run, Schedule, ScheduleStatus
from engine.domain.control_chars import visible
from engine.domain.schedule import canonical_json
from engine.domain.timeutil import format_duration, iso_local, iso_utc
from engine.service import BackfillReport, PreviewSlot
from vortos_tui.cli.output import one_line


def _instant(ms: int | None) -> str | None:
    return None if ms is None else iso_utc(ms)


def schedule_json(s: Schedule) -> dict[str, Any]:
    """The definition as ScheduleSpec.to_json spells it everywhere (the control socket, audit
    entries), then the schedule's state; instants as ISO 8601 UTC."""
    definition = s.spec.to_json()
    definition["trigger"].pop("anchored", None)  # a new interval's: stored, it is anchored
    definition["trigger"]["description"] = s.trigger.describe()
    return {
        "id": s.id,
        **definition,
        "origin": s.origin.value,
        "status": s.status.value,
        "pause_note": s.pause_note,
        # Static schedules: what the code declares, and an operator's override of it.
        "declared_status": s.declared_status.value if s.origin.value == "static" else None,
        "override": None
        if s.override is None
        else {**s.override.to_json(), "at": _instant(s.override.at)},
        "version": s.version,
        "next_slot_at": _instant(s.next_slot_at),
        "next_fire_at": _instant(s.next_fire_at),
        "next_fire_local": None
        if s.next_fire_at is None
        else iso_local(s.next_fire_at, s.timezone),
        "created_at": _instant(s.created_at),
        "updated_at": _instant(s.updated_at),
    }


def in_words(delta_ms: int) -> str:
    """'in 3m', '2h ago': coarse, for a glance."""
    ahead = delta_ms >= 0
    seconds = abs(delta_ms) // 1000
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")):
        if seconds >= size:
            text = f"{seconds // size}{unit}"
            break
    else:
        return "now"
    return f"in {text}" if ahead else f"{text} ago"


def schedules_table(schedules: list[Schedule], now_ms: int) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    # Nothing is cut short with an ellipsis: on a narrow terminal long values fold onto more
    # lines, the essentials (name, next fire, status) first in line.
    for column in ("NAME", "TENANT", "NEXT FIRE", "", "STATUS", "TRIGGER", "ZONE", "COMMAND"):
        table.add_column(column, overflow="fold")
    for s in schedules:
        if s.status is not ScheduleStatus.ACTIVE:
            next_fire, due = "-", ""
        elif s.next_fire_at is None:
            next_fire, due = "done", ""
        else:
            next_fire = iso_local(s.next_fire_at, s.timezone)
            due = in_words(s.next_fire_at - now_ms)
        status = s.status.value + (" (override)" if s.override else "")
        status += " (sensitive)" if s.sensitive else ""
        cells = (s.name, s.tenant, next_fire, due, status, s.trigger.describe(), s.timezone)
        table.add_row(*map(one_line, (*cells, s.command)))
    return table


def _override_rows(s: Schedule) -> list[tuple[str, str]]:
    if s.origin.value != "static":
        return []
    rows = [("declared", f"{s.declared_status.value} (in code)")]
    if s.override is not None:
        o = s.override
        rows.append(
            (
                "override",
                f"{o.state.value} by {o.by} at {iso_utc(o.at)}"
                + (f": {o.note}" if o.note else "")
                + " (`vortos schedule clear-override` returns it to the code's state)",
            )
        )
    return rows


def schedule_table(s: Schedule, now_ms: int) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    data = schedule_json(s)
    rows: list[tuple[str, str]] = [
        ("name", s.name),
        ("tenant", s.tenant),
        ("id", s.id),
        ("status", s.status.value),
        *_override_rows(s),
        ("trigger", s.trigger.describe()),
        *([("dst", s.trigger.dst_rules())] if isinstance(s.trigger, CronTrigger) else []),
        ("zone", s.timezone),
        ("command", s.command),
        ("payload", canonical_json(data["payload"])),
        (
            "misfire",
            f"{s.misfire.kind.value} (cap {s.misfire.catch_up_cap}, max age "
            f"{format_duration(s.misfire.max_age_ms)}, grace "
            f"{format_duration(s.misfire.grace_ms)})",
        ),
        ("overlap", s.overlap.value),
        ("jitter", format_duration(s.jitter_ms)),
        ("sensitive", "yes" if s.sensitive else "no"),
        ("origin", s.origin.value),
        (
            "retry",
            f"{s.retry.max_attempts} attempt(s), backoff {format_duration(s.retry.backoff_ms)} "
            f"doubling to {format_duration(s.retry.backoff_cap_ms)}",
        ),
        (
            "timeout",
            "the command's" if s.timeout_ms is None else format_duration(s.timeout_ms),
        ),
    ]
    if s.next_fire_at is not None:
        rows.append(
            (
                "next fire",
                f"{iso_local(s.next_fire_at, s.timezone)} ({in_words(s.next_fire_at - now_ms)})",
            )
        )
    else:
        rows.append(("next fire", "none (the trigger has no further slot)"))
    if s.pause_note:
        rows.append(("pause note", s.pause_note))
    for key, value in sorted(s.metadata.items()):
        rows.append((f"meta {key}", value))
    rows += [
        ("version", str(s.version)),
        ("created", data["created_at"]),
        ("updated", data["updated_at"]),
    ]
    for key, value in rows:
        # One line each: a note's or a metadata value's newline must not start a forged row.
        table.add_row(one_line(key), one_line(value))
    return table


def preview_json(slot: PreviewSlot) -> dict[str, Any]:
    return {
        "local": slot.local,
        "utc": slot.utc,
        "due_utc": iso_utc(slot.due_ms),
        "slot_key": slot.slot_key,
        "dst": slot.note.value or None,
    }


def preview_table(slots: list[PreviewSlot], dst_rules: str | None, width: int) -> Table:
    """LOCAL, UTC and DST in full (the offsets are what a DST change alters); the slot key,
    which spells the schedule id and the local time again, only where the terminal has room."""
    columns = ["LOCAL", "UTC", "DST"]
    rows = [[slot.local, slot.utc, slot.note.value] for slot in slots]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    keys = [slot.slot_key for slot in slots]
    with_keys = sum(widths) + 2 * len(widths) + max(len(k) for k in keys) <= width
    caption = f"DST: {dst_rules}" if dst_rules else None
    if not with_keys:
        caption = (caption + "\n" if caption else "") + "slot keys: --json or a wider terminal"
    table = Table(
        box=None, header_style="bold", pad_edge=False, caption=caption, caption_justify="left"
    )
    for column, least in zip(columns, widths, strict=True):
        table.add_column(column, no_wrap=True, min_width=least)
    if with_keys:
        table.add_column("SLOT KEY", no_wrap=True)
    for row, key in zip(rows, keys, strict=True):
        table.add_row(*row, *([key] if with_keys else []))
    return table


def run_json(r: Run) -> dict[str, Any]:
    return {
        "id": r.id,
        "tenant": r.tenant,
        "schedule_id": r.schedule_id,
        "schedule": r.schedule_name,
        "slot_key": r.slot_key,
        "slot_at": iso_utc(r.slot_at),
        "due_at": iso_utc(r.due_at),
        "kind": r.kind.value,
        "state": r.state.value,
        "dispatched_at": iso_utc(r.dispatched_at),
        "lateness_ms": r.lateness_ms,
        "node": r.node_id,
        "attempts": r.attempts,
        "started_at": _instant(r.started_at),
        "finished_at": _instant(r.finished_at),
        "duration_ms": r.duration_ms,
        "consumer": r.consumer,
        "abandoned": r.abandoned,
        "exit_code": r.exit_code,
        "error": r.error,
        "output": r.output,
    }


def run_table(r: Run) -> Table:
    """One run in full: its record, error and output tail."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    data = run_json(r)
    for key in (
        "id",
        "tenant",
        "schedule",
        "slot_key",
        "slot_at",
        "due_at",
        "kind",
        "state",
        "dispatched_at",
        "lateness_ms",
        "node",
        "attempts",
        "abandoned",
        "consumer",
        "started_at",
        "finished_at",
        "duration_ms",
        "exit_code",
        "error",
    ):
        value = data[key]
        if value is not None:
            table.add_row(key.replace("_", " "), one_line(str(value)))
    if r.output:
        table.add_row("output", output_block(r.output))
    return table


def output_block(output: str) -> Panel:
    """A program's output tail keeps its lines, fenced: every line (a folded one too) sits
    inside the frame, so none of it can pass for a line of ours."""
    shown = Text(visible(output.rstrip("\n")))
    return Panel(shown, box=box.SQUARE, expand=False, padding=(0, 1))


def fire_json(f: Fire, now_ms: int) -> dict[str, Any]:
    return {
        "run_id": f.run_id,
        "tenant": f.tenant,
        "schedule": f.schedule_name,
        "slot_key": f.slot_key,
        "kind": f.kind.value,
        "command": f.command,
        "state": f.state_at(now_ms).value,
        "attempts": f.attempts,
        "abandoned": f.abandoned_count,
        "available_at": iso_utc(f.available_at),
        "discarded_at": _instant(f.discarded_at),
        "reason": f.discard_reason,
    }


def fires_table(fires: list[Fire], now_ms: int) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("RUN", "SCHEDULE", "SLOT (UTC)", "ATTEMPTS", "DEAD SINCE", "REASON"):
        table.add_column(column, no_wrap=column != "REASON", overflow="fold")
    for f in fires:
        table.add_row(
            str(f.run_id),
            f"{f.tenant}/{f.schedule_name}",
            iso_utc(f.slot_at),
            str(f.attempts),
            "" if f.discarded_at is None else in_words(f.discarded_at - now_ms),
            one_line(f.discard_reason or ""),
        )
    return table


def backfill_json(report: BackfillReport) -> dict[str, Any]:
    return {
        "schedule": report.schedule,
        "slots": report.slots,
        "dispatched": report.dispatched,
        "already_dispatched": report.already,
        "first_slot": _instant(report.first_slot),
        "last_slot": _instant(report.last_slot),
    }


def runs_table(runs: list[Run]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("ID", "SCHEDULE", "SLOT (UTC)", "STATE", "TRY", "LATE", "TOOK", "KIND"):
        table.add_column(column, no_wrap=True)
    for r in runs:
        took = r.duration_ms
        table.add_row(
            str(r.id),
            r.schedule_name,
            iso_utc(r.slot_at),
            r.state.value,
            str(r.attempts),
            f"{r.lateness_ms} ms",
            "" if took is None else format_duration(took) if took >= 1000 else f"{took} ms",
            r.kind.value,
        )
    return table
