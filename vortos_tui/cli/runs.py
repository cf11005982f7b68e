"""`vortos runs ...`: the run ledger."""

from __future__ import annotations

from typing import Annotated

import typer

from engine import RunState
from engine.domain.errors import InvalidInput
from engine.domain.schedule import DEFAULT_TENANT
from engine.domain.timeutil import parse_instant
from engine.ports import RunQuery
from vortos_tui.cli.context import open_for_read, operator
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, say, stdout
from vortos_tui.cli.views import run_json, run_table, runs_table

app = typer.Typer(help="Read the run ledger.", no_args_is_help=True)


@app.command("list", epilog=EXIT_CODES)
@handles_errors
def list_(
    ctx: typer.Context,
    schedule: Annotated[str | None, typer.Option("--schedule", help="Only this schedule.")] = None,
    state: Annotated[
        RunState | None, typer.Option("--state", help="Only runs in this state.")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only slots at or after this instant (ISO 8601).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Only slots before this instant (ISO 8601).")
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", help="Only this tenant (with --schedule: the schedule's tenant)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100_000)] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Runs, newest slot first."""
    since_ms = None if since is None else parse_instant(since)
    until_ms = None if until is None else parse_instant(until)
    if since_ms is not None and until_ms is not None and until_ms <= since_ms:
        raise InvalidInput("--until must be after --since")
    with open_for_read(ctx) as engine:
        schedule_id = None
        if schedule is not None:
            schedule_id = engine.service.get(
                schedule, tenant=tenant or DEFAULT_TENANT, actor=operator()
            ).id
        runs = engine.service.runs(
            RunQuery(
                tenant=tenant,
                schedule_id=schedule_id,
                state=state,
                since_ms=since_ms,
                until_ms=until_ms,
                limit=limit,
            ),
            actor=operator(),
        )
        if as_json:
            emit_json([run_json(r) for r in runs])
        elif not runs:
            say("no runs match")
        else:
            stdout.print(runs_table(runs))


@app.command("show", epilog=EXIT_CODES)
@handles_errors
def show(
    ctx: typer.Context,
    run_id: Annotated[int, typer.Argument(help="The run's id.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """One run in full: when it was due, dispatched, started and finished, by whom, its
    attempts, error and output tail."""
    with open_for_read(ctx) as engine:
        run = engine.service.run(run_id, actor=operator())
        if as_json:
            emit_json(run_json(run))
        else:
            stdout.print(run_table(run))
