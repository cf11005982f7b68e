"""`vortos doctor`: every health check, one finding each; exit 1 on any failure (a deploy gate)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from engine import open_engine
from engine.api import default_node_id
from engine.control import RemoteService
from engine.domain.errors import VortosError
from engine.governance.doctor import DoctorContext, Report, Status, default_checks, run_checks
from engine.plugins.registry import PluginError, Selection
from engine.plugins.runtime import Builder, doctor_checks
from vortos_tui.cli.context import CliState, state
from vortos_tui.cli.output import emit_json, handles_errors, stdout

STATUS_STYLE = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.SKIP: "dim",
}


class DoctorFailed(VortosError):
    exit_code = 1


def run_doctor(cli: CliState) -> Report:
    """Every check on `cli`'s database, read-only (the CLI's doctor and the console's view),
    and the doctor_checks plug-ins. A plug-in that cannot be loaded is a failed finding
    (plugins.ports), not the end of the doctor."""
    if cli.control_socket is not None:
        # The service's own doctor, on its view: this process opens no database.
        with open_engine(cli.db, create=False, control_socket=cli.control_socket) as remote:
            assert isinstance(remote.service, RemoteService)
            return remote.service.doctor()
    plugins: Selection | None = None
    problem: str | None = None
    try:
        plugins = cli.plugins()
    except PluginError as exc:
        problem = str(exc)
    with open_engine(
        cli.db,
        create=False,
        readonly=True,
        enforce=True,
        plugins=plugins,
        settings=cli.settings,
    ) as engine:
        checks = default_checks()
        if plugins is not None:
            builder = Builder(engine.storage, engine.clock, cli.db, default_node_id(), cli.settings)
            try:
                checks += doctor_checks(plugins, builder)
            except PluginError as exc:
                problem = str(exc)
        return run_checks(
            DoctorContext(
                engine.storage,
                engine.clock,
                cli.db,
                key_file=cli.settings.audit_key_file,
                diagnostics=engine.storage.diagnostics(),
                commands=cli.commands(),
                static=cli.loaded_app().static if cli.app is not None else None,
                shards=cli.settings.shards,
                plugins=plugins,
                plugin_problem=problem,
                plugin_timeout_ms=cli.settings.plugin_timeout,
                settings=cli.settings,
            ),
            checks,
        )


@handles_errors
def doctor(
    ctx: typer.Context,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print {schema_version, clear, findings: [{check_id, status, summary, detail, "
            "remediation}]} only.",
        ),
    ] = False,
) -> None:
    """Run every health check. Exit 0 when nothing fails (warnings are shown, not fatal), 1
    otherwise: put it before a deploy. Reads only; it changes nothing. Give it the same --app
    as `vortos run`, so it knows the app's commands and static schedules."""
    report = run_doctor(state(ctx))
    if as_json:
        emit_json(report.to_json())
    else:
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for column in ("CHECK", "STATUS", "FINDING"):
            table.add_column(column, overflow="fold")
        for finding in report.findings:
            text = Text(finding.summary)
            if finding.detail:
                text.append(f"\n{finding.detail}", style="dim")
            if finding.remediation and finding.status in (Status.FAIL, Status.WARN):
                text.append(f"\nfix: {finding.remediation}", style="italic")
            table.add_row(
                finding.check_id,
                Text(finding.status.value.upper(), style=STATUS_STYLE[finding.status]),
                text,
            )
        stdout.print(table)
    if not report.clear:
        failed = [f.check_id for f in report.findings if f.status is Status.FAIL]
        raise DoctorFailed(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}")
