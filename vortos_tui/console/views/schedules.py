"""Schedules: due soonest first, with the verbs pause, resume and trigger now."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType

from engine import (
    Page,
    ReadModel,
    Schedule,
    ScheduleListQuery,
    ScheduleRow,
    ScheduleStatus,
)
from vortos_tui.console.actions import ScheduleRef, Verb
from vortos_tui.console.format import sparkline, state_text, trigger_words
from vortos_tui.console.views.cells import badges, name_cell, next_fire, overdue
from vortos_tui.console.views.lists import ListView
from vortos_tui.console.views.registry import ViewSpec, register_view
from vortos_tui.console.views.schedule_detail import ScheduleDetailView
from vortos_tui.console.views.verbs import check_verb, verb_bindings
from vortos_tui.console.widgets import PagedTable

NAME_WIDTH = 22


class SchedulesView(ListView):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Detail", id="open"),
        *verb_bindings(),
        Binding("slash", "filter", "Filter", id="filter", key_display="/"),
    ]
    filter_states = frozenset(s.value for s in ScheduleStatus)

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.rows: dict[str, Schedule] = {}

    def body(self) -> ComposeResult:
        table: PagedTable = PagedTable(cursor_type="row", zebra_stripes=True, id="schedules")
        table.add_column("NAME", width=NAME_WIDTH, key="name")
        table.add_column("STATE", key="state")
        table.add_column("NEXT", key="next")
        table.add_column("IN", key="in")
        table.add_column("LAST", key="last")
        table.add_column("RECENT", key="recent")
        table.add_column("TRIGGER", key="trigger")
        table.add_column("ZONE", key="zone")
        table.add_column("TENANT", key="tenant")
        yield table

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return check_verb(self.ctx, action, parameters, self.selected())

    def binding_state(self) -> object:
        chosen = self.selected()
        return (None if chosen is None else chosen.tenant), self.ctx.identity

    async def load(self, model: ReadModel, now_ms: int) -> Page[ScheduleRow]:
        status = None if self.filter.state is None else ScheduleStatus(self.filter.state)
        return await model.schedules(
            ScheduleListQuery(
                text=self.filter.text,
                tenant=self.filter.tenant,
                status=status,
                offset=self.page_offset,
                limit=self.ctx.page_size,
            )
        )

    def show(self, data: Page[ScheduleRow], now_ms: int) -> None:
        self.rows = {row.schedule.id: row.schedule for row in data.rows}
        cells = []
        for row in data.rows:
            s = row.schedule
            at, when = next_fire(s, now_ms, self.ctx.zone)
            last = row.last_outcome
            cells.append(
                (
                    s.id,
                    (
                        name_cell(s),
                        badges(s, late=overdue(s, row.last_slot_at, now_ms)),
                        at,
                        when,
                        state_text(last.value) if last else Text("-", style="dim"),
                        sparkline(row.recent),
                        trigger_words(s.trigger),
                        s.timezone,
                        s.tenant,
                    ),
                )
            )
        self.render_rows(cells, data.total, data.more)

    def selected(self) -> Schedule | None:
        key = self.table.selected_key()
        return None if key is None else self.rows.get(key)

    def action_open(self) -> None:
        schedule = self.selected()
        if schedule is not None:
            self.app.push_screen(ScheduleDetailView(self.ctx, schedule.id))

    def on_data_table_row_selected(self, event: PagedTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def on_data_table_row_highlighted(self, event: PagedTable.RowHighlighted) -> None:
        self.recheck_bindings()

    async def action_verb(self, verb: str) -> None:
        schedule = self.selected()
        if schedule is None:
            self.notify("no schedule selected", severity="warning")
            return
        act = getattr(self.app, "ask_verb", None)
        if act is not None:
            await act(Verb(verb), ScheduleRef.of(schedule))

    async def action_refused(self, verb: str) -> None:
        await self.action_verb(verb)  # the console says why, and opens nothing


SPEC = register_view(
    ViewSpec(
        name="schedules",
        title="Schedules",
        summary="every schedule, due soonest first",
        factory=SchedulesView,
        order=10,
        aliases=("sc", "sched", "s"),
    )
)
