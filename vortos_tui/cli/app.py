"""The `vortos` command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine.api import DEFAULT_DB
from engine.config import load_settings
from engine.file_modes import file_access, use_file_access
from vortos_tui.cli import approvals, audit, db, operators, queue, retention, runs, schedule
from vortos_tui.cli.config import app as config_app
from vortos_tui.cli.consume import consume
from vortos_tui.cli.context import CliState, given_flags
from vortos_tui.cli.doctor import doctor
from vortos_tui.cli.output import EXIT_CODES, handles_errors
from vortos_tui.cli.plugins import plugins
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
@handles_errors
def main(
    ctx: typer.Context,
    db_path: Annotated[
        str,
        typer.Option(
            "--db",
            help="SQLite database file, or a postgresql://user@host/database URL (VORTOS_DB).",
            show_default=True,
        ),
    ] = DEFAULT_DB,
    app_modules: Annotated[
        str | None,
        typer.Option(
            "--app",
            help="Python module(s), comma-separated, whose @schedulable commands and "
            "@scheduled schedules this process knows (the current directory is importable; "
            "VORTOS_APP).",
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
            help="Send every change through this `vortos run --control-socket`, which makes it "
            "as your account; the database is then only read here (VORTOS_CONTROL_SOCKET).",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Settings file (VORTOS_CONFIG; default ./vortos.toml when present). "
            "`vortos config show` prints the effective settings.",
        ),
    ] = None,
) -> None:
    """Vortos: exactly-once periodic job scheduler."""
    given = given_flags(
        ctx, {"db_path": "db", "app_modules": "app", "control_socket": "control_socket"}
    )
    # Every setting is read and checked here, before any command opens the database.
    settings = load_settings(flags=given, config=config)
    # Every file this process creates is private to this layout, whatever the umask.
    use_file_access(file_access(settings.control_group, settings.operator_file_access))
    ctx.obj = CliState(
        db=settings.db,
        app=settings.app,
        allow_exec=list(allow_exec or []),
        control_socket=settings.control_socket,
        settings=settings,
    )


app.command("run", epilog=EXIT_CODES)(run)
app.command("consume", epilog=EXIT_CODES)(consume)
app.command("doctor", epilog=EXIT_CODES)(doctor)
app.command("plugins", epilog=EXIT_CODES)(plugins)
app.add_typer(config_app, name="config", epilog=EXIT_CODES)
app.add_typer(retention.app, name="retention", epilog=EXIT_CODES)
app.command("prune", epilog=EXIT_CODES)(retention.prune)
app.command("tui", epilog=EXIT_CODES)(handles_errors(console))
app.add_typer(schedule.app, name="schedule", epilog=EXIT_CODES)
app.add_typer(runs.app, name="runs", epilog=EXIT_CODES)
app.add_typer(queue.app, name="queue", epilog=EXIT_CODES)
app.add_typer(db.app, name="db", epilog=EXIT_CODES)
app.add_typer(audit.app, name="audit", epilog=EXIT_CODES)
app.add_typer(operators.app, name="operators", epilog=EXIT_CODES)
app.add_typer(approvals.app, name="approvals", epilog=EXIT_CODES)
