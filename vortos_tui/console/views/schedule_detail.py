"""Schedule detail: the definition, the next 10 fire instants with DST marks, recent runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from engine import (
    CronTrigger,
    PreviewSlot,
    ReadModel,
    ScheduleDetail,
    ScheduleStatus,
    StorageError,
    preview_slots,
)
from vortos_tui.console.actions import ScheduleRef, Verb
from vortos_tui.console.context import ConsoleContext
from vortos_tui.console.format import (
    duration,
    full_instant,
    in_words,
    instant,
    trigger_words,
)
from vortos_tui.console.views.base import LiveView
from vortos_tui.console.views.cells import (
    badges,
    facts,
    fire_cells,
    next_fire,
    override_facts,
)
from vortos_tui.console.views.run_detail import RunDetailView
from vortos_tui.console.views.verbs import check_verb, verb_bindings
from vortos_tui.console.widgets import PagedTable

UPCOMING = 10


@dataclass(frozen=True, slots=True)
class Loaded:
    detail: ScheduleDetail
    upcoming: list[PreviewSlot]


class ScheduleDetailView(LiveView):
    BINDINGS: ClassVar[list[BindingType]] = [
        *verb_bindings(),
        Binding("enter", "open", "Run detail", id="open"),
    ]

    def __init__(self, ctx: ConsoleContext, schedule_id: str) -> None:
        super().__init__(ctx)
        self.schedule_id = schedule_id
        self.loaded_detail: ScheduleDetail | None = None

    def body(self) -> ComposeResult:
        with VerticalScroll(id="detail"):
            yield Static(id="summary")
            yield Static(id="definition")
            yield Static(id="upcoming")
            yield Static(Text("Recent runs", style="bold"), classes="section")
            table: PagedTable = PagedTable(cursor_type="row", id="runs")
            for label in ("SLOT", "SCHEDULE", "STATE", "LATE", "TRY", "TOOK", "CONSUMER", "KIND"):
                table.add_column(label, key=label.lower())
            yield table

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        shown = None if self.loaded_detail is None else self.loaded_detail.schedule
        return check_verb(self.ctx, action, parameters, shown)

    def binding_state(self) -> object:
        shown = None if self.loaded_detail is None else self.loaded_detail.schedule.tenant
        return shown, self.ctx.identity

    async def load(self, model: ReadModel, now_ms: int) -> Loaded:
        detail = await model.schedule(self.schedule_id, runs=20)
        if detail is None:
            raise StorageError("this schedule no longer exists (deleted meanwhile): esc goes back")
        upcoming = (
            preview_slots(detail.schedule, now_ms, UPCOMING)
            if detail.schedule.status is ScheduleStatus.ACTIVE
            else []
        )
        return Loaded(detail, upcoming)

    def show(self, data: Loaded, now_ms: int) -> None:
        self.loaded_detail = data.detail
        s = data.detail.schedule
        zone = self.ctx.zone
        at, when = next_fire(s, now_ms, zone)
        summary = Text()
        summary.append(s.name, style="bold")
        summary.append("  ")
        summary.append_text(badges(s))
        summary.append(f"  next {at} ({when})")
        self.query_one("#summary", Static).update(summary)
        retry = s.retry
        definition = facts(
            [
                ("tenant", s.tenant),
                ("trigger", f"{trigger_words(s.trigger)}  [{s.trigger.describe()}]"),
                *([("dst", s.trigger.dst_rules())] if isinstance(s.trigger, CronTrigger) else []),
                ("zone", s.timezone),
                ("command", s.command),
                ("payload", json.dumps(dict(s.payload), sort_keys=True)),
                (
                    "misfire",
                    f"{s.misfire.kind.value} (cap {s.misfire.catch_up_cap}, "
                    f"max age {duration(s.misfire.max_age_ms)}, "
                    f"grace {duration(s.misfire.grace_ms)})",
                ),
                ("overlap", s.overlap.value),
                (
                    "retry",
                    f"{retry.max_attempts} attempts, backoff {duration(retry.backoff_ms)} "
                    f"to {duration(retry.backoff_cap_ms)}",
                ),
                ("jitter", duration(s.jitter_ms)),
                ("origin", s.origin.value),
                *override_facts(s, zone),
                ("pause note", s.pause_note or "-"),
                ("version", str(s.version)),
                ("updated", full_instant(s.updated_at, zone)),
                ("id", s.id),
            ]
        )
        self.query_one("#definition", Static).update(definition)
        upcoming = Table(
            title=f"Next {UPCOMING} fires ({s.timezone})",
            title_justify="left",
            title_style="bold",
            box=None,
            padding=(0, 1),
        )
        upcoming.add_column("LOCAL")
        upcoming.add_column("IN")
        upcoming.add_column("DST")
        for slot in data.upcoming:
            upcoming.add_row(
                slot.local,
                in_words(slot.due_ms - now_ms),
                Text(slot.note.value, style="bold yellow") if slot.note.value else "",
            )
        body = (
            upcoming
            if data.upcoming
            else Group(upcoming, Text(f"none: the schedule is {s.status.value}", style="dim"))
        )
        self.query_one("#upcoming", Static).update(body)
        self.query_one(PagedTable).sync(
            [(str(r.id), fire_cells(r, now_ms, zone)[:8]) for r in data.detail.runs],
            follow_top=True,
        )
        self.banners.position = f"schedule {s.tenant}/{s.name} · {instant(now_ms, zone)}"

    def action_open(self) -> None:
        key = self.query_one(PagedTable).selected_key()
        if key is not None:
            self.app.push_screen(RunDetailView(self.ctx, int(key)))

    def on_data_table_row_selected(self, event: PagedTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    async def action_verb(self, verb: str) -> None:
        if self.loaded_detail is None:
            return
        ask = getattr(self.app, "ask_verb", None)
        if ask is not None:
            await ask(Verb(verb), ScheduleRef.of(self.loaded_detail.schedule))

    async def action_refused(self, verb: str) -> None:
        await self.action_verb(verb)  # the console says why, and opens nothing
