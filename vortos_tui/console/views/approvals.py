"""Approvals: four-eyes requests, pending first, the requested change shown as a diff against
the schedule as stored; `a` approves, `x` rejects (with a reason), for operators the policy
lets approve in the request's tenant, other than the requester."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Static

from engine import Approval, ApprovalState, ReadModel
from engine.domain.access import Operation
from vortos_tui.console.context import ConsoleContext
from vortos_tui.console.format import in_words, instant, plain
from vortos_tui.console.views.base import LiveView
from vortos_tui.console.views.registry import ViewSpec, register_view
from vortos_tui.console.views.verbs import refused_id
from vortos_tui.console.widgets import PagedTable

STATE_STYLE = {
    ApprovalState.PENDING: "bold yellow",
    ApprovalState.APPROVED: "green",
    ApprovalState.REJECTED: "red",
    ApprovalState.EXPIRED: "dim",
    ApprovalState.CONSUMED: "dim green",
}


def change_lines(approval: Approval) -> Text:
    """The requested change, one `+ key: value` line per field (a diff against nothing: what
    the approval would let run)."""
    out = Text()
    out.append(f"{approval.operation.value} ", style="bold")
    out.append(f"{approval.tenant}/{approval.schedule}\n", style="bold cyan")
    for key, value in sorted(approval.change.items()):
        if key == "schedule":
            continue
        rendered = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
        out.append_text(plain(Text(f"+ {key}: {rendered}", style="green"), one_line=True))
        out.append("\n")
    return out


class ApprovalsView(LiveView):
    # Each key is bound twice, as the schedule verbs are (see views.verbs): the hidden second
    # binding answers a decision hidden from this operator with the reason.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "decide('approve')", "Approve", id="approve"),
        Binding("a", "refused('approve')", "Approve", show=False, id=refused_id("approve")),
        Binding("x", "decide('reject')", "Reject", id="reject"),
        Binding("x", "refused('reject')", "Reject", show=False, id=refused_id("reject")),
    ]
    CSS = """
    ApprovalsView #requests { height: 1fr; }
    ApprovalsView #change { height: auto; max-height: 12; border-top: solid $primary; }
    """

    def __init__(self, ctx: ConsoleContext) -> None:
        super().__init__(ctx)
        self.rows: dict[str, Approval] = {}

    def body(self) -> ComposeResult:
        table: PagedTable = PagedTable(cursor_type="row", zebra_stripes=True, id="requests")
        for label in ("ID", "STATE", "OPERATION", "SCHEDULE", "BY", "ASKED", "EXPIRES"):
            table.add_column(label, key=label.lower())
        yield table
        yield Static(id="change")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "decide":
            return self._decision_offered()
        if action == "refused":
            # Only reached when the decision on the same key was hidden (not when dimmed).
            offered = self._decision_offered()
            return offered is False and not self.ctx.read_only and self.selected() is not None
        return True

    def _decision_offered(self) -> bool | None:
        if self.ctx.read_only:
            return False
        chosen = self.selected()
        # Hidden for the requester and for an operator the policy keeps from deciding in the
        # request's tenant; dimmed for anything that is not pending.
        if chosen is not None and (
            chosen.requested_by == self.ctx.operator
            or not self.ctx.may(Operation.APPROVE, chosen.tenant).allowed
        ):
            return False
        if chosen is None or chosen.state_at(self.ctx.clock.now_ms()) is not ApprovalState.PENDING:
            return None
        return True

    async def load(self, model: ReadModel, now_ms: int) -> list[Approval]:
        return await model.approvals(limit=self.ctx.page_size)

    def show(self, data: list[Approval], now_ms: int) -> None:
        zone = self.ctx.zone
        self.rows = {a.id: a for a in data}
        rows = []
        for a in data:
            state = a.state_at(now_ms)
            rows.append(
                (
                    a.id,
                    (
                        a.id,
                        Text(state.value, style=STATE_STYLE[state]),
                        a.operation.value,
                        f"{a.tenant}/{a.schedule}",
                        a.requested_by,
                        instant(a.requested_at, zone, now_ms),
                        in_words(a.expires_at - now_ms) if state is ApprovalState.PENDING else "-",
                    ),
                )
            )
        self.query_one(PagedTable).sync(rows, follow_top=False)
        pending = sum(1 for a in data if a.state_at(now_ms) is ApprovalState.PENDING)
        self.banners.position = f"{pending} pending of {len(data)}"
        self._show_change()
        self.refresh_bindings()

    def selected(self) -> Approval | None:
        key = self.query_one(PagedTable).selected_key()
        return None if key is None else self.rows.get(key)

    def _show_change(self) -> None:
        chosen = self.selected()
        self.query_one("#change", Static).update(
            change_lines(chosen) if chosen is not None else Text("no request", style="dim")
        )

    def on_data_table_row_highlighted(self, event: PagedTable.RowHighlighted) -> None:
        self._show_change()
        self.refresh_bindings()

    async def action_decide(self, verb: str) -> None:
        chosen = self.selected()
        decide: Any = getattr(self.app, "ask_decision", None)
        if chosen is not None and decide is not None:
            decide(verb, chosen)

    async def action_refused(self, verb: str) -> None:
        await self.action_decide(verb)  # the console says why, and opens nothing


SPEC = register_view(
    ViewSpec(
        name="approvals",
        title="Approvals",
        summary="four-eyes requests, pending first",
        factory=ApprovalsView,
        order=30,
        aliases=("ap", "approval"),
    )
)
