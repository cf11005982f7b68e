"""`vortos queue ...`: dead letters, the fires that will not run again by themselves."""

from __future__ import annotations

from typing import Annotated

import typer

from engine.domain.errors import InvalidInput
from vortos_tui.cli.context import open_existing, open_for_read, operator
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, say, stdout
from vortos_tui.cli.views import fire_json, fires_table

app = typer.Typer(help="Dead letters: list, requeue, purge.", no_args_is_help=True)

Tenant = Annotated[str | None, typer.Option("--tenant", help="Only this tenant's.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON only (messages go to stderr).")]
RunIds = Annotated[
    list[int] | None, typer.Argument(help="Run ids of dead letters.", show_default=False)
]
All = Annotated[bool, typer.Option("--all", help="Every dead letter (of --tenant, if given).")]


def _selection(run_ids: list[int] | None, every: bool) -> list[int] | None:
    if every and run_ids:
        raise InvalidInput("give run ids or --all, not both")
    if not every and not run_ids:
        raise InvalidInput("give the run ids of dead letters (see `vortos queue list`), or --all")
    return None if every else run_ids


@app.command("list", epilog=EXIT_CODES)
@handles_errors
def list_(
    ctx: typer.Context,
    tenant: Tenant = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 100,
    as_json: Json = False,
) -> None:
    """Dead letters, oldest run first: fires that failed every attempt, failed for good, or
    were abandoned too often."""
    with open_for_read(ctx) as engine:
        fires = engine.service.dead_letters(tenant=tenant, limit=limit, actor=operator())
        now = engine.clock.now_ms()
        if as_json:
            emit_json([fire_json(f, now) for f in fires])
        elif not fires:
            say("no dead letters")
        else:
            stdout.print(fires_table(fires, now))


@app.command("requeue", epilog=EXIT_CODES)
@handles_errors
def requeue(
    ctx: typer.Context, run_ids: RunIds = None, every: All = False, tenant: Tenant = None
) -> None:
    """Run dead letters again, now. Their runs go back to dispatched; attempts are counted on."""
    chosen = _selection(run_ids, every)
    with open_existing(ctx) as engine:
        count = engine.service.requeue(chosen, actor=operator(), tenant=tenant)
        say(f"requeued {count} dead letter(s)")


@app.command("purge", epilog=EXIT_CODES)
@handles_errors
def purge(
    ctx: typer.Context,
    run_ids: RunIds = None,
    every: All = False,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm purging with --all.")] = False,
    tenant: Tenant = None,
) -> None:
    """Delete dead letters for good. Their runs stay in the ledger."""
    chosen = _selection(run_ids, every)
    if chosen is None and not yes:
        raise InvalidInput("purging every dead letter needs --yes")
    with open_existing(ctx) as engine:
        count = engine.service.purge(chosen, actor=operator(), tenant=tenant)
        say(f"purged {count} dead letter(s)")
