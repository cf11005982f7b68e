"""The `vortos` command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine.api import DEFAULT_DB
from vortos_tui.cli import approvals, audit, db, operators, queue, runs, schedule
from vortos_tui.cli.consume import consume
from vortos_tui.cli.context import CliState
from vortos_tui.cli.doctor import doctor
from vortos_tui.cli.output import EXIT_CODES, handles_errors
from vortos_tui.cli.run import run
from vortos_tui.console.main import console

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
    app_modules: Annotated[
        str | None,
        typer.Option(
            "--app",
            envvar="VORTOS_APP",
            help="Python module(s), comma-separated, whose @schedulable commands and "
            "@scheduled schedules this process knows (the current directory is importable).",
        ),
    ] = None,
    allow_exec: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-exec",
            help="Executable (absolute path) the process command may run; repeat for more. "
            "Adds to VORTOS_PROCESS_ALLOW (paths separated by ':').",
        ),
    ] = None,
    control_socket: Annotated[
        Path | None,
        typer.Option(
            "--control-socket",
            envvar="VORTOS_CONTROL_SOCKET",
            help="Send every change through this `vortos run --control-socket`, which makes it "
            "as your account; the database is then only read here.",
        ),
    ] = None,
) -> None:
    """Vortos: exactly-once periodic job scheduler."""
    ctx.obj = CliState(
        db=db_path,
        app=app_modules,
        allow_exec=list(allow_exec or []),
        control_socket=control_socket,
    )


app.command("run", epilog=EXIT_CODES)(run)
app.command("consume", epilog=EXIT_CODES)(consume)
app.command("doctor", epilog=EXIT_CODES)(doctor)
app.command("tui", epilog=EXIT_CODES)(handles_errors(console))
app.add_typer(schedule.app, name="schedule", epilog=EXIT_CODES)
app.add_typer(runs.app, name="runs", epilog=EXIT_CODES)
app.add_typer(queue.app, name="queue", epilog=EXIT_CODES)
app.add_typer(db.app, name="db", epilog=EXIT_CODES)
app.add_typer(audit.app, name="audit", epilog=EXIT_CODES)
app.add_typer(operators.app, name="operators", epilog=EXIT_CODES)
app.add_typer(approvals.app, name="approvals", epilog=EXIT_CODES)
