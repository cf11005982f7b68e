"""Modal screens: the verb confirmation, the view jumper and the help."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, OptionList, Static
from textual.widgets.option_list import Option

from engine.domain.schedule import NOTE_MAX
from vortos_tui.console.actions import ScheduleRef, Verb
from vortos_tui.console.views.registry import ViewSpec, find_view


@dataclass(frozen=True, slots=True)
class Confirmed:
    note: str | None


VERB_TITLE = {
    Verb.PAUSE: "Pause",
    Verb.RESUME: "Resume",
    Verb.TRIGGER: "Trigger now",
    Verb.EDIT: "Edit",
}
VERB_EFFECT = {
    Verb.PAUSE: "No slot fires until it is resumed; runs already queued are skipped.",
    Verb.RESUME: "It fires again from its next slot; slots missed while paused do not fire.",
    Verb.TRIGGER: "One manual run now; the schedule's own slots are unchanged.",
    Verb.EDIT: "Only what you give changes, as `vortos schedule edit` takes it. A new trigger, "
    "zone or jitter fires from the next slot.",
}
EDIT_MAX = 4_000  # characters of typed changes (a payload may be among them)


class ConfirmVerb(ModalScreen[Confirmed | None]):
    """Names the schedule and the operator; Cancel has the focus, so enter alone does nothing
    harmful."""

    DEFAULT_CSS = """
    ConfirmVerb { align: center middle; }
    ConfirmVerb > Vertical {
        width: 64; max-width: 100%; height: auto; border: thick $warning; background: $surface;
        padding: 0 1;
    }
    ConfirmVerb #question { text-style: bold; }
    ConfirmVerb Horizontal { height: auto; align-horizontal: right; }
    ConfirmVerb Button { margin: 0 0 0 1; min-width: 10; }
    ConfirmVerb Input { margin: 0 0 1 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="confirm-cancel"),
    ]

    def __init__(self, verb: Verb, ref: ScheduleRef, operator: str) -> None:
        super().__init__()
        self.verb, self.ref, self.operator = verb, ref, operator

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"{VERB_TITLE[self.verb]} {self.ref.label}?", id="question")
            yield Static(Text(f"as operator {self.operator}", style="italic"))
            yield Static(Text(VERB_EFFECT[self.verb], style="dim"))
            if self.verb is Verb.PAUSE:
                yield Input(placeholder="note (why; optional)", max_length=NOTE_MAX, id="note")
            if self.verb is Verb.EDIT:
                yield Input(
                    placeholder="e.g. --misfire-grace 5m --jitter 30s",
                    max_length=EDIT_MAX,
                    id="note",
                )
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(VERB_TITLE[self.verb], id="confirm", variant="warning")

    def on_mount(self) -> None:
        # An edit starts in its changes (nothing happens without the confirm button);
        # the others on Cancel, so enter alone does nothing harmful.
        if self.verb is Verb.EDIT:
            self.query_one("#note", Input).focus()
        else:
            self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id != "confirm":
            self.dismiss(None)
            return
        note = self.query("#note").first(Input).value.strip() if self.query("#note") else ""
        self.dismiss(Confirmed(note or None))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        # Enter after a note moves to the confirm button: acting stays a separate keypress.
        event.stop()
        self.query_one("#confirm", Button).focus()

    def action_cancel(self) -> None:
        self.dismiss(None)


class JumpTo(ModalScreen[str | None]):
    """`:` then a view's name (or the start of it) and enter; the list narrows as you type."""

    DEFAULT_CSS = """
    JumpTo { align: center top; }
    JumpTo > Vertical { width: 60; max-width: 100%; height: auto; margin-top: 3;
        border: thick $accent; background: $surface; }
    JumpTo OptionList { height: auto; max-height: 12; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="jump-cancel"),
        Binding("down", "down", show=False),
        Binding("up", "up", show=False),
    ]

    def __init__(self, views: list[ViewSpec]) -> None:
        super().__init__()
        self.views = views

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Input(placeholder=":view", id="jump")
            yield OptionList(*self._options(""), id="choices")

    def _options(self, typed: str) -> list[Option]:
        wanted = typed.strip().lower().lstrip(":")
        return [
            Option(Text.assemble((f"{v.name:<12}", "bold"), v.summary), id=v.name)
            for v in self.views
            if not wanted
            or v.name.startswith(wanted)
            or any(a.startswith(wanted) for a in v.aliases)
            or wanted in v.title.lower()
        ]

    def on_mount(self) -> None:
        self.query_one(Input).focus()
        self.query_one(OptionList).highlighted = 0

    def on_input_changed(self, event: Input.Changed) -> None:
        choices = self.query_one(OptionList)
        choices.clear_options()
        choices.add_options(self._options(event.value))
        if choices.option_count:
            choices.highlighted = 0

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        exact = find_view(event.value)
        if exact is not None:
            self.dismiss(exact.name)
            return
        choices = self.query_one(OptionList)
        if choices.highlighted is not None and choices.option_count:
            self.dismiss(choices.get_option_at_index(choices.highlighted).id)
        else:
            self.notify(f"no view named {event.value!r}", severity="warning")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_down(self) -> None:
        self.query_one(OptionList).action_cursor_down()

    def action_up(self) -> None:
        self.query_one(OptionList).action_cursor_up()

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every key that applies here, with its binding id (for a keymap file)."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 72; max-width: 100%; height: auto; max-height: 90%;
        border: thick $accent; background: $surface; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "close", "Close", id="help-close"),
    ]

    def __init__(self, keys: list[tuple[str, str, str]], views: list[ViewSpec]) -> None:
        super().__init__()
        self.keys, self.views = keys, views

    def compose(self) -> ComposeResult:
        table = Table(box=None, padding=(0, 1), title="Keys", title_justify="left")
        table.add_column("KEY", style="bold")
        table.add_column("DOES")
        table.add_column("ID", style="dim")
        for key, description, binding_id in self.keys:
            table.add_row(key, description, binding_id)
        views = Table(
            box=None, padding=(0, 1), title="Views (: then the name)", title_justify="left"
        )
        views.add_column("NAME", style="bold")
        views.add_column("SHOWS")
        for view in self.views:
            views.add_row(view.name, view.summary)
        filters = Text(
            "Filter (/): words match the name; tenant:NAME and state:STATE match exactly.",
            style="dim",
        )
        with VerticalScroll():
            yield Static(table)
            yield Static(views)
            yield Static(filters)

    def action_close(self) -> None:
        self.dismiss(None)
