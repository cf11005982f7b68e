"""`vortos config show`: the effective settings and where each came from."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from vortos_tui.cli.context import state
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, stdout

app = typer.Typer(help="The effective settings.", no_args_is_help=True)


@app.command("show", epilog=EXIT_CODES)
@handles_errors
def show(
    ctx: typer.Context,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print {name: {value, source}} only.")
    ] = False,
) -> None:
    """Each setting's effective value and its source: default, the config file, a VORTOS_*
    variable, or a flag. Command flags (such as `vortos run --lease-ttl`) apply to their own
    command and are not shown here."""
    settings = state(ctx).settings
    if as_json:
        emit_json(settings.to_json())
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("SETTING", "VALUE", "FROM"):
        table.add_column(column, overflow="fold")
    for name, value, source in settings.rows():
        table.add_row(name, value, source)
    stdout.print(table)
