"""The confirmation of an approval decision: names the request, the change and the operator;
Cancel has the focus; a rejection needs a reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from engine import Approval
from engine.domain.approvals import REASON_MAX, REASON_MIN
from vortos_tui.console.views.approvals import change_lines


@dataclass(frozen=True, slots=True)
class Decided:
    reason: str | None


class ConfirmDecision(ModalScreen[Decided | None]):
    DEFAULT_CSS = """
    ConfirmDecision { align: center middle; }
    ConfirmDecision > Vertical {
        width: 70; max-width: 100%; height: auto; border: thick $warning; background: $surface;
        padding: 0 1;
    }
    ConfirmDecision #question { text-style: bold; }
    ConfirmDecision Horizontal { height: auto; align-horizontal: right; }
    ConfirmDecision Button { margin: 0 0 0 1; min-width: 10; }
    ConfirmDecision #problem { color: $error; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="decide-cancel"),
    ]

    def __init__(self, verb: str, approval: Approval, operator: str) -> None:
        super().__init__()
        self.verb, self.approval, self.operator = verb, approval, operator

    def compose(self) -> ComposeResult:
        a = self.approval
        with Vertical():
            yield Static(
                f"{self.verb.capitalize()} request {a.id} by {a.requested_by}?", id="question"
            )
            yield Static(Text(f"as operator {self.operator}", style="italic"))
            yield Static(change_lines(a))
            if self.verb == "reject":
                yield Input(
                    placeholder=f"reason (at least {REASON_MIN} characters)",
                    max_length=REASON_MAX,
                    id="reason",
                )
                yield Static(id="problem")
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.verb.capitalize(), id="confirm", variant="warning")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id != "confirm":
            self.dismiss(None)
            return
        if self.verb != "reject":
            self.dismiss(Decided(None))
            return
        reason = self.query_one("#reason", Input).value.strip()
        if len(reason) < REASON_MIN:
            self.query_one("#problem", Static).update(
                f"a rejection needs a reason of at least {REASON_MIN} characters"
            )
            self.query_one("#reason", Input).focus()
            return
        self.dismiss(Decided(reason))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one("#confirm", Button).focus()

    def action_cancel(self) -> None:
        self.dismiss(None)
