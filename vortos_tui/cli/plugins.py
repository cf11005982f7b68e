"""`vortos plugins`: every replaceable port, what the settings select for it, and what is
installed (built-ins and entry points), without starting anything."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from engine.domain.redact import scrub
from engine.plugins.registry import PORTS, PluginError, available, find, installed
from vortos_tui.cli.context import state
from vortos_tui.cli.output import emit_json, handles_errors, stdout


@handles_errors
def plugins(
    ctx: typer.Context,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print [{setting, group, selected, available, problem}] only."),
    ] = False,
) -> None:
    """List each port's setting, entry-point group, what is selected (imported to check it) and
    what could be. Exit 2 when a selected plug-in cannot be loaded."""
    settings = state(ctx).settings
    rows: list[tuple[str, str, list[str], list[str], str | None]] = []
    problems = []
    for port in PORTS:
        value = getattr(settings, port.setting)
        chosen = [] if value is None else list(value) if port.many else [value]
        shown: list[str] = []
        problem: str | None = None
        for name in chosen:
            try:
                shown.append(find(port, str(name)).describe())
            except PluginError as exc:
                problem = scrub(str(exc))  # a plug-in's message may quote a URL
                problems.append(problem)
        names = available(port)
        dists = {
            ep.name: f"{ep.name} ({ep.dist.name if ep.dist else '?'})" for ep in installed(port)
        }
        could = [dists.get(n, f"{n} (built-in)") for n in names]
        rows.append((port.setting, port.group, shown, could, problem))
    if as_json:
        emit_json(
            [
                {"setting": s, "group": g, "selected": c, "available": a, "problem": p}
                for s, g, c, a, p in rows
            ]
        )
    else:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("SETTING", "SELECTED", "AVAILABLE", "GROUP"):
            table.add_column(column, overflow="fold")
        for setting, group, selected, could, problem in rows:
            table.add_row(
                setting,
                Text(problem, style="red") if problem else "\n".join(selected) or "-",
                ", ".join(could) or "-",
                group,
            )
        stdout.print(table)
    if problems:
        raise PluginError("; ".join(problems))
