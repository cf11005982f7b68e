"""Audit: each chain's head and how far it was last verified, its newest entries, `v` to
verify (incrementally, as `vortos audit verify`) and `V` to verify in full (as `--full`), with
its progress; `x` cancels a verification."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Static

from engine import AuditOverview, ChainStatus, ReadModel
from engine.domain.audit import summary
from vortos_tui.console.actions import VerifyRun
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


def entry_detail(data: dict[str, Any], slot_key: str | None, event: str = "") -> str:
    if slot_key:
        return slot_key
    said = summary(event, data)
    if said is not None:
        return said
    return ", ".join(f"{k}={v}" for k, v in sorted(data.items()) if k != "definition")


class AuditView(LiveView):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("v", "verify", "Verify", id="verify"),
        Binding("V", "verify_full", "Full verify", id="verify-full"),
        Binding("x", "cancel_verify", "Cancel verify", id="verify-cancel"),
    ]
    CSS = """
    AuditView #chains { height: auto; max-height: 8; }
    AuditView #verify-progress { height: 1; display: none; }
    AuditView #verify-progress.running { display: block; }
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
        yield Static(id="verify-progress")
        yield Static(id="entries-title")
        entries: PagedTable = PagedTable(cursor_type="row", zebra_stripes=True, id="entries")
        for label in ("SEQ", "AT", "EVENT", "ACTOR", "SLOT KEY / DATA"):
            entries.add_column(label, key=label.lower())
        yield entries

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("verify", "verify_full"):
            return not self.ctx.read_only
        if action == "cancel_verify":
            return self._verification() is not None
        return True

    def binding_state(self) -> object:
        return self._verification() is not None  # `x` shows while a verification runs

    def _verification(self) -> VerifyRun | None:
        run: Any = getattr(self.app, "verify_run", None)
        return run if isinstance(run, VerifyRun) else None

    def show_verify_progress(self) -> None:
        """The running verification's progress under the chains (hidden when none runs)."""
        run = self._verification()
        line = self.query_one("#verify-progress", Static)
        line.set_class(run is not None, "running")
        self.recheck_bindings()
        if run is None:
            line.update("")
            return
        text = Text(f"{run.label}: ", style="bold")
        if run.total is None:
            text.append("the control socket's server is verifying…")
        else:
            share = 100 if not run.total else run.checked * 100 // run.total
            text.append(f"{run.checked:,} / {run.total:,} entries checked ({share}%)")
        text.append("    x cancels", style="dim")
        line.update(text)

    async def load(self, model: ReadModel, now_ms: int) -> AuditOverview:
        return await model.audit(self.chain, limit=100)

    def show(self, data: AuditOverview, now_ms: int) -> None:
        zone = self.ctx.zone
        if (
            self.chain is not None
            and data.chain != self.chain
            and self.chain in {c.chain for c in data.chains}
        ):
            # The operator moved to another chain while this read ran: showing it would pull
            # the cursor back to where they were. Read theirs instead.
            refresh: Any = getattr(self.app, "refresh_now", None)
            if refresh is not None:
                refresh()
            return
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
                        entry_detail(dict(e.data), e.slot_key, e.event),
                    ),
                )
                for e in data.recent
            ],
            follow_top=True,
        )
        self.banners.position = f"{len(data.chains)} chain(s)"
        self.show_verify_progress()

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

    async def action_verify_full(self) -> None:
        verify: Any = getattr(self.app, "verify_audit", None)
        if verify is not None:
            verify(full=True)

    async def action_cancel_verify(self) -> None:
        cancel: Any = getattr(self.app, "cancel_verify", None)
        if cancel is not None:
            cancel()


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
