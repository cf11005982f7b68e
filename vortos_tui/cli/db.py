"""`vortos db ...`: create, upgrade and inspect the database."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from vortos_tui.cli.context import open_for_read, open_for_write
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, say, stdout

app = typer.Typer(help="Create, upgrade and inspect the database.", no_args_is_help=True)


@app.command("init", epilog=EXIT_CODES)
@handles_errors
def init(ctx: typer.Context) -> None:
    """Create the database, or upgrade an older schema in place. Safe to repeat."""
    with open_for_write(ctx) as engine:
        info = engine.storage.describe()
        say(f"database ready: {info['path']} (schema version {info['schema_version']})")


@app.command("info", epilog=EXIT_CODES)
@handles_errors
def info(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Where the database is, its schema, and what it holds."""
    with open_for_read(ctx) as engine:
        facts = engine.storage.describe()
        lease = engine.storage.leases.current("scheduler:leader")
        facts["leader"] = None if lease is None else lease.holder
        if as_json:
            emit_json(facts)
            return
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column(style="bold")
        table.add_column()
        for key, value in facts.items():
            table.add_row(key.replace("_", " "), "-" if value is None else str(value))
        stdout.print(table)
