"""Live fires: every run, newest first, following new fires as they arrive."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType

from engine import FireListQuery, Page, ReadModel, Run, RunState
from vortos_tui.console.views.cells import fire_cells
from vortos_tui.console.views.lists import ListView
from vortos_tui.console.views.registry import ViewSpec, register_view
from vortos_tui.console.views.run_detail import RunDetailView
from vortos_tui.console.widgets import PagedTable


class FiresView(ListView):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Run detail", id="open"),
        Binding("slash", "filter", "Filter", id="filter", key_display="/"),
    ]
    filter_states = frozenset(s.value for s in RunState)
    follow_top = True

    def body(self) -> ComposeResult:
        table: PagedTable = PagedTable(cursor_type="row", zebra_stripes=True, id="fires")
        table.add_column("SLOT", key="slot")
        table.add_column("SCHEDULE", width=20, key="schedule")
        table.add_column("STATE", key="state")
        table.add_column("LATE", key="late")
        table.add_column("TRY", key="attempt")
        table.add_column("TOOK", key="duration")
        table.add_column("CONSUMER", key="consumer")
        table.add_column("KIND", key="kind")
        table.add_column("TENANT", key="tenant")
        table.add_column("RUN", key="run")
        yield table

    async def load(self, model: ReadModel, now_ms: int) -> Page[Run]:
        state = None if self.filter.state is None else RunState(self.filter.state)
        return await model.fires(
            FireListQuery(
                text=self.filter.text,
                tenant=self.filter.tenant,
                state=state,
                offset=self.page_offset,
                limit=self.ctx.page_size,
            )
        )

    def show(self, data: Page[Run], now_ms: int) -> None:
        rows = [(str(run.id), fire_cells(run, now_ms, self.ctx.zone)) for run in data.rows]
        self.render_rows(rows, data.total, data.more)

    def action_open(self) -> None:
        key = self.table.selected_key()
        if key is not None:
            self.app.push_screen(RunDetailView(self.ctx, int(key)))

    def on_data_table_row_selected(self, event: PagedTable.RowSelected) -> None:
        event.stop()
        self.action_open()


SPEC = register_view(
    ViewSpec(
        name="fires",
        title="Live fires",
        summary="every run, newest first, as it happens",
        factory=FiresView,
        order=20,
        aliases=("f", "runs", "live"),
    )
)
