"""`vortos db ...`: create, upgrade and inspect the database."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.table import Table

from engine.domain.database import POSTGRESQL
from engine.domain.errors import InvalidInput
from engine.governance.keys import KEY_ENV, KEY_FILE_ENV, create_key_file
from vortos_tui.cli.context import open_for_read, open_for_write, operator, state
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, say, stdout

app = typer.Typer(help="Create, upgrade and inspect the database.", no_args_is_help=True)


@app.command("init", epilog=EXIT_CODES)
@handles_errors
def init(ctx: typer.Context) -> None:
    """Create the database, or upgrade an older schema in place. Safe to repeat."""
    _refuse_through_a_socket(ctx, "db init")
    if state(ctx).db.backend == POSTGRESQL:
        migrate(ctx)
        return
    with open_for_write(ctx) as engine:
        info = engine.storage.describe()
        ring = engine.storage.audit.establish()
        say(f"database ready: {info['path']} (schema version {info['schema_version']})")
        say(f"audit key {ring.active_id} (epoch {ring.epoch}) is this database's")


@app.command("migrate", epilog=EXIT_CODES)
@handles_errors
def migrate(ctx: typer.Context) -> None:
    """Create the Vortos schema, or upgrade it to this version, in one transaction (all of it
    or none). Safe to repeat, and to run from several hosts at once. On PostgreSQL, run it
    before the first `vortos run` and after each upgrade of vortos; it also creates the shared
    audit key file named by audit_key_file when there is none yet."""
    _refuse_through_a_socket(ctx, "db migrate")
    cli = state(ctx)
    if cli.db.backend != POSTGRESQL:
        init(ctx)
        return
    from engine.backends.postgres import migrate_database  # noqa: PLC0415 - the postgres extra

    before, after = migrate_database(cli.db.location)
    where = cli.db.shown
    if before is None:
        say(f"created the Vortos schema (version {after}) in {where}")
    elif before < after:
        say(f"upgraded the Vortos schema of {where} from version {before} to {after}")
    else:
        say(f"the Vortos schema of {where} is current (version {after})")
    key_file = cli.settings.audit_key_file
    if key_file is not None and not key_file.exists():
        create_key_file(key_file)
        say(
            f"created the audit key file {key_file}: copy it to every node (mode 0600) and keep "
            "a backup; without it the audit chain can be neither extended nor verified"
        )
    elif key_file is None and not os.environ.get(KEY_ENV):
        say(
            "note: every node signs the audit chain and needs the same key; set audit_key_file "
            f"(vortos.toml or {KEY_FILE_ENV}) and run this again to create it, or set {KEY_ENV}"
        )
        return
    # The key is recorded now, in a transaction: hosts migrating at once agree on one key or
    # lose (AuditKeyMismatch, exit 2, naming both fingerprints).
    with open_for_write(ctx) as engine:
        ring = engine.storage.audit.establish()
    say(f"audit key {ring.active_id} (epoch {ring.epoch}) is this database's")


def _refuse_through_a_socket(ctx: typer.Context, command: str) -> None:
    """Creating or upgrading the schema writes the database itself: no control socket serves
    it (the socket's server would be the one running on that schema)."""
    if state(ctx).control_socket is not None:
        raise InvalidInput(
            f"{command} is the service account's: run it as the account that runs `vortos run "
            "--control-socket`, without VORTOS_CONTROL_SOCKET or --control-socket"
        )


@app.command("info", epilog=EXIT_CODES)
@handles_errors
def info(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Where the database is, its schema, and what it holds."""
    with open_for_read(ctx) as engine:
        facts = engine.service.database_info(actor=operator())
        if as_json:
            emit_json(facts)
            return
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column(style="bold")
        table.add_column()
        for key, value in facts.items():
            table.add_row(key.replace("_", " "), "-" if value is None else str(value))
        stdout.print(table)
