"""A live view: a screen in the frame whose data the console re-reads on every refresh."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer

from engine import Overview, ReadModel
from vortos_tui.console.context import ConsoleContext
from vortos_tui.console.widgets import (
    Banners,
    ConsoleHeader,
    FilterBar,
    StatusLine,
    access_notice,
)

_UNCHECKED = object()


class LiveView(Screen[None]):
    """Subclasses compose their body in `body()`, read in `load()` and render in `show()`.

    `load` runs on the console's poll loop (never two at once); `show` runs after it on the
    same screen, and only when the read succeeded.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", id="back"),
    ]
    # Filter grammar words this view understands besides a name substring, e.g. tenant, state.
    filterable: ClassVar[bool] = False

    def __init__(self, ctx: ConsoleContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.banners = Banners()
        self.loaded = False
        self._binding_state: object = _UNCHECKED

    def compose(self) -> ComposeResult:
        yield ConsoleHeader()
        yield StatusLine()
        yield from self.body()
        if self.filterable:
            yield FilterBar(placeholder="name  tenant:T  state:S    enter apply · esc clear")
        yield Footer()

    def body(self) -> ComposeResult:
        raise NotImplementedError

    async def load(self, model: ReadModel, now_ms: int) -> Any:
        raise NotImplementedError

    def show(self, data: Any, now_ms: int) -> None:
        raise NotImplementedError

    def show_frame(self, overview: Overview | None) -> None:
        if overview is not None:
            self.banners.access = access_notice(self.ctx.operator, overview)
        self.query_one(ConsoleHeader).show(self.ctx, overview)
        self.query_one(StatusLine).show(self.banners)

    def binding_state(self) -> object:
        """What this view's `check_action` depends on besides the read-only switch (e.g. the
        selected row's tenant and the operator's grants): its keys are checked again when it
        changes (see `recheck_bindings`)."""
        return None

    def recheck_bindings(self) -> None:
        """Check the keys again if `binding_state` changed; only then, as every check redraws
        the footer."""
        state = self.binding_state()
        if state != self._binding_state:
            self._binding_state = state
            self.refresh_bindings()

    def on_screen_resume(self) -> None:
        # Coming (back) into view: read at once rather than at the next tick.
        refresh = getattr(self.app, "refresh_now", None)
        if refresh is not None:
            refresh()

    def action_back(self) -> None:
        if self.app.screen is not self:
            return
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
            return
        go_back = getattr(self.app, "go_back", None)
        if go_back is not None:
            go_back()
