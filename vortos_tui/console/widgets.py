"""The frame's widgets: the header, the status line, the filter bar and the paged table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable, Input, Static
from textual.widgets.data_table import CellDoesNotExist

from engine import Overview
from vortos_tui.console.context import ConsoleContext, NodeRole
from vortos_tui.console.format import clock_time, in_words, plain

ROLE_STYLE = {
    NodeRole.LEADER: "bold green",
    NodeRole.STANDBY: "yellow",
    NodeRole.ATTACHED: "cyan",
    NodeRole.DOWN: "bold reverse red",
}


class ConsoleHeader(Static):
    """Two lines: where and who; then which node leads and what the queue holds."""

    DEFAULT_CSS = """
    ConsoleHeader {
        height: 2; background: $panel; color: $foreground; padding: 0 1;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    """

    def show(self, ctx: ConsoleContext, overview: Overview | None) -> None:
        now = ctx.clock.now_ms()
        node = ctx.node()
        top = Text()
        top.append("vortos ", style="bold")
        top.append(ctx.db_label, style="bold cyan")
        top.append("  node ")
        top.append(node.role.value, style=ROLE_STYLE[node.role])
        if node.breaker is not None:
            top.append(" ")
            top.append(
                f"BREAKER {node.breaker.replace('_', '-').upper()}", style="bold reverse red"
            )
        top.append("  op ")
        top.append(ctx.operator_label or ctx.operator, style="bold")
        if ctx.read_only:
            top.append(" (read-only)", style="yellow")
        if overview is not None and not overview.scope.every:
            # Everything below is counted and listed within these tenants only.
            top.append("  tenants: ", style="dim")
            top.append(", ".join(sorted(overview.scope.tenants or ())) or "none", style="bold")
        top.append("  ")
        top.append(f"{clock_time(now, ctx.zone)} {ctx.zone.key}", style="bold")
        second = Text()
        if overview is None:
            second.append("reading…", style="dim")
        else:
            leader = overview.leader
            if leader is None or leader.expires_at <= now:
                second.append("no leader", style="bold red")
                if leader is not None:
                    second.append(f" (last {leader.holder}, {in_words(leader.expires_at - now)})")
            else:
                second.append("leader ", style="dim")
                second.append(leader.holder, style="bold")
                held = in_words(leader.acquired_at - now).removesuffix(" ago")
                age = max(0, now - leader.renewed_at) // 1000
                second.append(f" for {held}" if held != "now" else " since now")
                second.append(f" (renewed {age}s ago)" if age else " (renewed now)", style="dim")
            second.append(
                f"  sched {overview.active}/{overview.schedules}  open {overview.open_fires}"
                f"  run {overview.running}"
            )
            second.append("  dead ")
            second.append(
                str(overview.dead_letters), style="bold magenta" if overview.dead_letters else ""
            )
        top.append("\n")
        top.append_text(second)
        top.no_wrap = True
        top.overflow = "ellipsis"
        self.update(top)


def access_notice(operator: str, overview: Overview) -> str | None:
    """What to say when the operator may see nothing at all in a governed database, so that an
    empty screen does not look broken."""
    identity = overview.identity
    if identity is None:
        return None
    if not identity.grants:
        return (
            f"no role in this database: ask an admin for `vortos operators grant {operator} viewer`"
        )
    if overview.scope.empty:
        return (
            f"{operator}'s roles here let them view no tenant: ask an admin for "
            f"`vortos operators grant {operator} viewer --tenant T`"
        )
    return None


@dataclass(slots=True)
class Banners:
    degraded: str | None = None
    access: str | None = None  # the operator may see nothing: why, and what to ask for
    live: bool = True
    filter: str = ""
    position: str = ""


class StatusLine(Static):
    """One line: degraded state, an operator who may see nothing, or paused refresh first (they
    matter most), then filter and paging."""

    DEFAULT_CSS = """
    StatusLine {
        height: 1; padding: 0 1; background: $boost; text-wrap: nowrap; text-overflow: ellipsis;
    }
    StatusLine.-degraded { background: $error 40%; }
    /* What to ask an admin for is said whole, on a second line if it must. */
    StatusLine.-access { background: $warning 40%; height: auto; max-height: 3; text-wrap: wrap; }
    """

    def show(self, banners: Banners) -> None:
        line = Text(no_wrap=not banners.access, overflow="ellipsis")
        if banners.degraded:
            line.append(banners.degraded, style="bold")
            line.append("  ")
        if banners.access:
            line.append(banners.access, style="bold")
            line.append("  ")
        if not banners.live:
            line.append("LIVE PAUSED (space resumes)", style="bold reverse yellow")
            line.append("  ")
        if banners.filter:
            line.append("filter ", style="dim")
            line.append(banners.filter, style="bold")
            line.append("  ")
        line.append(banners.position, style="dim")
        self.set_class(bool(banners.degraded), "-degraded")
        self.set_class(bool(banners.access) and not banners.degraded, "-access")
        self.update(line)


class FilterBar(Input):
    """`/` opens it; enter applies; esc clears the filter and closes it."""

    DEFAULT_CSS = """
    FilterBar { dock: bottom; display: none; height: 3; }
    FilterBar.-open { display: block; }
    """

    class Applied(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "clear", "Clear filter", id="filter-clear")
    ]

    def open(self) -> None:
        self.add_class("-open")
        self.focus()

    def close(self) -> None:
        self.remove_class("-open")

    def action_clear(self) -> None:
        self.value = ""
        self.close()
        self.post_message(self.Applied(""))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.close()
        self.post_message(self.Applied(event.value.strip()))


class PagedTable(DataTable[Text | str]):
    """A table holding one page of rows; moving past either edge asks for the next page."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown: dict[str, tuple[Text | str, ...]] = {}  # key -> cells, in row order

    class Edge(Message):
        def __init__(self, direction: int) -> None:
            super().__init__()
            self.direction = direction

    def action_cursor_down(self) -> None:
        if self.row_count and self.cursor_row >= self.row_count - 1:
            self.post_message(self.Edge(+1))
            return
        super().action_cursor_down()

    def action_cursor_up(self) -> None:
        if self.cursor_row <= 0:
            self.post_message(self.Edge(-1))
            return
        super().action_cursor_up()

    def sync(self, rows: Sequence[tuple[str, Sequence[Text | str]]], *, follow_top: bool) -> None:
        """Show `rows` (key, cells), keeping the cursor on the row it was on when that row is
        still here; with `follow_top`, a cursor on the first row stays on the first row.

        Only cells that changed are written: every write drops the table's render cache, and
        rewriting a whole page on each refresh cost more than reading it."""
        # Plain strings become Text here: the table would parse a str as markup on every paint
        # (slower, and a "[" in a name would be taken for a style). Every list's cells pass
        # here, so here stored text loses what could steer the terminal (see `plain`).
        rows = [(key, tuple(plain(c, one_line=True) for c in cells)) for key, cells in rows]
        keys = [key for key, _ in rows]
        if keys == list(self._shown):
            columns = list(self.columns)
            for key, cells in rows:
                before = self._shown[key]
                for index, (column, cell) in enumerate(zip(columns, cells, strict=True)):
                    if before[index] != cell:
                        self.update_cell(key, column, cell, update_width=True)
                self._shown[key] = tuple(cells)
            return
        current = self._key_at_cursor()
        at_top = self.cursor_row <= 0
        index = self.cursor_row
        self.clear()
        self._shown = {}
        for key, cells in rows:
            self.add_row(*cells, key=key)
            self._shown[key] = tuple(cells)
        if follow_top and at_top:
            target = 0
        elif current is not None and current in self._shown:
            target = keys.index(current)
        else:
            target = min(index, len(keys) - 1)
        if keys:
            self.move_cursor(row=max(0, target), animate=False, scroll=True)

    def _key_at_cursor(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except CellDoesNotExist:  # a cursor past the rows: no row to keep
            return None

    def selected_key(self) -> str | None:
        return self._key_at_cursor()
