"""A live view over one paged, filterable list (Schedules, Live fires)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from engine import InvalidInput
from vortos_tui.console.context import ConsoleContext
from vortos_tui.console.filters import Filter, parse_filter
from vortos_tui.console.views.base import LiveView
from vortos_tui.console.views.cells import Cells
from vortos_tui.console.widgets import FilterBar, PagedTable


class ListView(LiveView):
    filterable = True
    filter_states: ClassVar[frozenset[str]] = frozenset()
    follow_top: ClassVar[bool] = False  # a cursor on the first row stays there as rows arrive

    def __init__(self, ctx: ConsoleContext) -> None:
        super().__init__(ctx)
        self.filter = Filter()
        self.page_offset = 0
        self.total: int | None = None
        self.more = False
        self._place: int | None = None  # where the cursor goes after a page change

    @property
    def table(self) -> PagedTable:
        return self.query_one(PagedTable)

    def render_rows(self, rows: Sequence[tuple[str, Cells]], total: int | None, more: bool) -> None:
        self.total, self.more = total, more
        table = self.table
        table.sync(rows, follow_top=self.follow_top and self.page_offset == 0)
        if self._place is not None and rows:
            table.move_cursor(row=self._place % len(rows), animate=False)
        self._place = None
        first, last = self.page_offset + 1, self.page_offset + len(rows)
        span = f"{first}-{last}" if rows else "none"
        self.banners.position = f"{span} of {total}" if total is not None else span
        if more:
            self.banners.position += " (↓ past the last row for more)"

    def action_filter(self) -> None:
        bar = self.query_one(FilterBar)
        bar.value = self.filter.spelled
        bar.open()

    def on_filter_bar_applied(self, event: FilterBar.Applied) -> None:
        self.table.focus()
        try:
            self.filter = parse_filter(event.text, self.filter_states)
        except InvalidInput as exc:
            self.notify(str(exc), title="filter not applied", severity="error")
            return
        self.page_offset = 0
        self.banners.filter = self.filter.spelled
        self.app_refresh()

    def on_paged_table_edge(self, event: PagedTable.Edge) -> None:
        step = self.ctx.page_size
        if event.direction > 0 and self.more:
            self.page_offset += step
            self._place = 0
        elif event.direction < 0 and self.page_offset > 0:
            self.page_offset = max(0, self.page_offset - step)
            self._place = -1
        else:
            return
        self.app_refresh()

    def app_refresh(self) -> None:
        refresh: Any = getattr(self.app, "refresh_now", None)
        if refresh is not None:
            refresh()
