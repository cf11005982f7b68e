"""The `vortos` command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine.api import DEFAULT_DB
from vortos_tui.cli import db, runs, schedule
from vortos_tui.cli.context import CliState
from vortos_tui.cli.output import EXIT_CODES
from vortos_tui.cli.run import run

app = typer.Typer(
    name="vortos",
    help="Vortos: exactly-once periodic job scheduler.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def main(
    ctx: typer.Context,
    db_path: Annotated[
        Path,
        typer.Option("--db", envvar="VORTOS_DB", help="SQLite database file.", show_default=True),
    ] = Path(DEFAULT_DB),
) -> None:
    """Vortos: exactly-once periodic job scheduler."""
    ctx.obj = CliState(db=db_path)


app.command("run", epilog=EXIT_CODES)(run)
app.add_typer(schedule.app, name="schedule", epilog=EXIT_CODES)
app.add_typer(runs.app, name="runs", epilog=EXIT_CODES)
app.add_typer(db.app, name="db", epilog=EXIT_CODES)
