"""Audit: each chain's head and how far it was last verified, its newest entries, and `v` to
verify (incrementally, as `vortos audit verify`)."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Static

from engine import AuditOverview, ChainStatus, ReadModel
from vortos_tui.console.context import ConsoleContext
from vortos_tui.console.format import instant
from vortos_tui.console.views.base import LiveView
from vortos_tui.console.views.registry import ViewSpec, register_view
from vortos_tui.console.widgets import PagedTable


def verification(status: ChainStatus) -> Text:
    if status.verified_seq is None:
        return Text("never verified", style="bold yellow")
    behind = status.head_seq - status.verified_seq
    if behind < 0:
        return Text(f"verified to {status.verified_seq}: chain SHORTER", style="bold red")
    if behind == 0:
        return Text("verified to head", style="green")
    return Text(f"{behind} since last verify", style="yellow")


def entry_detail(data: dict[str, Any], slot_key: str | None) -> str:
    if slot_key:
        return slot_key
    return ", ".join(f"{k}={v}" for k, v in sorted(data.items()) if k != "definition")


class AuditView(LiveView):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("v", "verify", "Verify", id="verify"),
    ]
    CSS = """
    AuditView #chains { height: auto; max-height: 8; }
    AuditView #entries { height: 1fr; }
    """

    def __init__(self, ctx: ConsoleContext) -> None:
        super().__init__(ctx)
        self.chain: str | None = None  # the chain whose entries show; None: newest written

    def body(self) -> ComposeResult:
        chains: PagedTable = PagedTable(cursor_type="row", id="chains")
        for label in ("CHAIN", "ENTRIES", "LAST ENTRY", "VERIFICATION", "VERIFIED AT"):
            chains.add_column(label, key=label.lower())
        yield chains
        yield Static(id="entries-title")
        entries: PagedTable = PagedTable(cursor_type="row", zebra_stripes=True, id="entries")
        for label in ("SEQ", "AT", "EVENT", "ACTOR", "SLOT KEY / DATA"):
            entries.add_column(label, key=label.lower())
        yield entries

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "verify" and self.ctx.read_only)

    async def load(self, model: ReadModel, now_ms: int) -> AuditOverview:
        return await model.audit(self.chain, limit=100)

    def show(self, data: AuditOverview, now_ms: int) -> None:
        zone = self.ctx.zone
        self.query_one("#chains", PagedTable).sync(
            [
                (
                    c.chain,
                    (
                        c.chain,
                        str(c.head_seq),
                        instant(c.head_at, zone, now_ms),
                        verification(c),
                        instant(c.verified_at, zone, now_ms),
                    ),
                )
                for c in data.chains
            ],
            follow_top=False,
        )
        self.chain = data.chain
        table = self.query_one("#chains", PagedTable)
        table.refresh(layout=True)  # its height follows its rows
        keys = [c.chain for c in data.chains]
        if data.chain in keys and table.cursor_row != keys.index(data.chain):
            table.move_cursor(row=keys.index(data.chain), animate=False)
        title = Text("Newest entries of ", style="bold")
        title.append(data.chain or "no chain yet", style="bold cyan")
        self.query_one("#entries-title", Static).update(title)
        self.query_one("#entries", PagedTable).sync(
            [
                (
                    f"{e.chain}:{e.seq}",
                    (
                        str(e.seq),
                        instant(e.at, zone, now_ms),
                        e.event,
                        e.actor,
                        entry_detail(dict(e.data), e.slot_key),
                    ),
                )
                for e in data.recent
            ],
            follow_top=True,
        )
        self.banners.position = f"{len(data.chains)} chain(s)"

    def on_data_table_row_highlighted(self, event: PagedTable.RowHighlighted) -> None:
        if event.data_table.id != "chains" or event.row_key.value is None:
            return
        if event.row_key.value != self.chain:
            self.chain = event.row_key.value
            refresh: Any = getattr(self.app, "refresh_now", None)
            if refresh is not None:
                refresh()

    async def action_verify(self) -> None:
        verify: Any = getattr(self.app, "verify_audit", None)
        if verify is not None:
            verify()


SPEC = register_view(
    ViewSpec(
        name="audit",
        title="Audit",
        summary="the audit chains: heads, verification, newest entries",
        factory=AuditView,
        order=50,
        aliases=("a", "au"),
    )
)
