"""Run detail: a run's whole record, its fire's bookkeeping, its error and the output's tail."""

from __future__ import annotations

from rich.panel import Panel
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from engine import ReadModel, RunDetail, StorageError
from engine.domain.timeutil import iso_utc
from vortos_tui.console.context import ConsoleContext
from vortos_tui.console.format import full_instant, plain, state_text
from vortos_tui.console.views.base import LiveView
from vortos_tui.console.views.cells import facts, lateness, run_duration

OUTPUT_TAIL_LINES = 40


def tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> str:
    kept = text.splitlines()[-lines:]
    return "\n".join(kept)


class RunDetailView(LiveView):
    def __init__(self, ctx: ConsoleContext, run_id: int) -> None:
        super().__init__(ctx)
        self.run_id = run_id

    def body(self) -> ComposeResult:
        with VerticalScroll(id="detail"):
            yield Static(id="summary")
            yield Static(id="error")  # before the record: at 80x24 it must show unscrolled
            yield Static(id="record")
            yield Static(id="output")

    async def load(self, model: ReadModel, now_ms: int) -> RunDetail:
        detail = await model.run(self.run_id)
        if detail is None:
            raise StorageError(f"run {self.run_id} is gone (pruned meanwhile): esc goes back")
        return detail

    def show(self, data: RunDetail, now_ms: int) -> None:
        run, fire, zone = data.run, data.fire, self.ctx.zone
        summary = Text()
        summary.append(f"run {run.id} ", style="bold")
        summary.append(run.schedule_name, style="bold")
        summary.append("  ")
        summary.append_text(state_text(run.state.value))
        summary.append(f"  {run.kind.value}  attempt {run.attempts}")
        self.query_one("#summary", Static).update(summary)
        rows: list[tuple[str, Text | str]] = [
            ("tenant", run.tenant),
            ("slot", f"{full_instant(run.slot_at, zone)}  (UTC {iso_utc(run.slot_at)})"),
            ("slot key", run.slot_key),
            ("due", full_instant(run.due_at, zone)),
            ("dispatched", f"{full_instant(run.dispatched_at, zone)} by {run.node_id}"),
            ("started", full_instant(run.started_at, zone)),
            ("late", lateness(run, now_ms)),
            ("finished", full_instant(run.finished_at, zone)),
            ("took", run_duration(run, now_ms)),
            ("consumer", run.consumer or "-"),
            ("exit code", "-" if run.exit_code is None else str(run.exit_code)),
            ("abandoned", str(run.abandoned)),
        ]
        if fire is not None:
            rows += [
                ("command", fire.command),
                ("available", full_instant(fire.available_at, zone)),
                ("claimed by", fire.consumed_by or "-"),
                ("claim until", full_instant(fire.consumed_till, zone)),
                ("failures", f"{fire.consecutive_failures} in a row"),
                ("stale acks", str(fire.stale_ack_count)),
                ("dead letter", fire.discard_reason or "-"),
            ]
        else:
            rows.append(("fire", Text("pruned from the fire queue", style="dim")))
        self.query_one("#record", Static).update(facts(rows))
        error = run.error or (fire.last_error if fire is not None else None)
        self.query_one("#error", Static).update(
            Panel(plain(Text(error, style="red")), title="error", title_align="left")
            if error
            else Text("")
        )
        output = run.output or ""
        self.query_one("#output", Static).update(
            Panel(
                plain(tail(output)) if output else Text("(no output)", style="dim"),
                title=f"output (last {OUTPUT_TAIL_LINES} lines)",
                title_align="left",
            )
        )
        self.banners.position = f"run {run.id} of {run.tenant}/{run.schedule_name}"
