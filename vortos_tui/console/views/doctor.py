"""Doctor: every health check's finding, failures first, with what to do; `r` runs them again
(they also run again on their own every half minute while the view is open)."""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType

from engine import ReadModel
from engine.governance.doctor import Report, Status
from vortos_tui.console.context import ConsoleContext
from vortos_tui.console.views.base import LiveView
from vortos_tui.console.views.registry import ViewSpec, register_view
from vortos_tui.console.widgets import PagedTable

RERUN_EVERY_S = 30.0
STYLE = {
    Status.FAIL: "bold reverse red",
    Status.WARN: "bold yellow",
    Status.PASS: "green",
    Status.SKIP: "dim",
}
ORDER = {Status.FAIL: 0, Status.WARN: 1, Status.PASS: 2, Status.SKIP: 3}


class DoctorView(LiveView):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("R", "rerun", "Run checks", id="rerun-checks"),
    ]
    CSS = "DoctorView #findings { height: 1fr; }"

    def __init__(self, ctx: ConsoleContext) -> None:
        super().__init__(ctx)
        self._report: Report | None = None
        self._ran_at = 0.0  # monotonic: how old the findings are
        self._forced = False

    def body(self) -> ComposeResult:
        table: PagedTable = PagedTable(cursor_type="row", zebra_stripes=True, id="findings")
        for label in ("CHECK", "STATUS", "FINDING", "WHAT TO DO"):
            table.add_column(label, key=label.lower())
        yield table

    async def load(self, model: ReadModel, now_ms: int) -> Report | None:
        doctor = self.ctx.doctor
        if doctor is None:
            return None
        stale = time.monotonic() - self._ran_at >= RERUN_EVERY_S
        if self._report is None or stale or self._forced:
            self._forced = False
            # The checks read the whole database: on a worker thread, not the event loop.
            self._report = await asyncio.to_thread(doctor)
            self._ran_at = time.monotonic()
        return self._report

    def show(self, data: Report | None, now_ms: int) -> None:
        table = self.query_one("#findings", PagedTable)
        if data is None:
            table.sync([], follow_top=False)
            self.banners.position = "the doctor is not available in this console"
            return
        findings = sorted(data.findings, key=lambda f: ORDER[f.status])
        rows = []
        for f in findings:
            finding = Text(f.summary)
            if f.detail:
                finding.append(f" ({f.detail})", style="dim")
            todo = f.remediation if f.status in (Status.FAIL, Status.WARN) else ""
            rows.append(
                (
                    f.check_id,
                    (
                        f.check_id,
                        Text(f.status.value.upper(), style=STYLE[f.status]),
                        finding,
                        todo,
                    ),
                )
            )
        table.sync(rows, follow_top=False)
        failed = sum(1 for f in data.findings if f.status is Status.FAIL)
        warned = sum(1 for f in data.findings if f.status is Status.WARN)
        verdict = "clear" if data.clear else f"{failed} failing"
        self.banners.position = f"{verdict}, {warned} warning(s), {len(data.findings)} checks"

    async def action_rerun(self) -> None:
        self._forced = True
        refresh = getattr(self.app, "refresh_now", None)
        if refresh is not None:
            refresh()


SPEC = register_view(
    ViewSpec(
        name="doctor",
        title="Doctor",
        summary="every health check: failures first, with what to do",
        factory=DoctorView,
        order=60,
        aliases=("dr", "health"),
    )
)
