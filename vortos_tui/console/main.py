"""`vortos-tui` (and `vortos tui`): open the console, with the engine beside it by default."""

from __future__ import annotations

import logging
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo

import typer
from textual.binding import Binding

from engine import DEFAULT_DB, Engine, InvalidInput, SystemClock, open_engine, open_read_model
from engine.api import default_node_id
from engine.domain.timeutil import format_duration, parse_duration, zone
from engine.runtime.daemon import MIN_LEASE_TTL_MS
from vortos_tui.cli.context import CliState, operator
from vortos_tui.cli.demo import demo_commands, seed_demo
from vortos_tui.cli.output import say
from vortos_tui.cli.workers import ClaimTtl, Consumers, NodeId, check_node_id, consumer_settings
from vortos_tui.console.actions import ConsoleActions
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.context import DEFAULT_REFRESH_S, ConsoleContext, attached
from vortos_tui.console.dialogs import ConfirmVerb, HelpScreen, JumpTo
from vortos_tui.console.engine_host import EngineHost
from vortos_tui.console.logs import route_logs
from vortos_tui.console.views.base import LiveView
from vortos_tui.console.views.registry import views
from vortos_tui.console.views.run_detail import RunDetailView
from vortos_tui.console.views.schedule_detail import ScheduleDetailView
from vortos_tui.console.web import serve
from vortos_tui.console.widgets import FilterBar

log = logging.getLogger("vortos.console")

MIN_REFRESH_MS = 100
MAX_REFRESH_MS = 60_000
DEFAULT_WEB_PORT = 8000


def local_zone(name: str | None) -> ZoneInfo:
    """The operator's zone: --zone, else TZ, else the system's /etc/localtime, else UTC."""
    if name:
        return zone(name)
    env = os.environ.get("TZ", "").lstrip(":")
    if env:
        try:
            return zone(env)
        except InvalidInput:
            pass  # a POSIX TZ string, not an IANA name: fall through to the system's
    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        return ZoneInfo("UTC")
    _, marker, key = target.partition("zoneinfo/")
    try:
        return zone(key) if marker else ZoneInfo("UTC")
    except InvalidInput:
        return ZoneInfo("UTC")


def load_keymap(path: Path | None, known: set[str]) -> dict[str, str]:
    """A TOML file of `binding-id = "keys"` (keys comma-separated) under [keys]."""
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"keymap file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInput(f"keymap file {path} cannot be read: {exc}") from None
    keys = data.get("keys")
    if not isinstance(keys, dict) or not keys:
        raise InvalidInput(f'keymap file {path} needs a [keys] table, e.g. pause = "P"')
    keymap: dict[str, str] = {}
    for binding_id, value in keys.items():
        if binding_id not in known:
            raise InvalidInput(
                f"keymap file {path}: no key binding has the id {binding_id!r} "
                f"(ids: {', '.join(sorted(known))})"
            )
        if not isinstance(value, str) or not value.strip():
            raise InvalidInput(f'keymap file {path}: {binding_id} needs keys as text, e.g. "P"')
        keymap[binding_id] = value
    return keymap


def binding_ids() -> set[str]:
    """Every binding id of the console, its views and its dialogs (what a keymap may name)."""
    owners: list[Any] = [VortosConsole, LiveView, ScheduleDetailView, RunDetailView, FilterBar]
    owners += [ConfirmVerb, JumpTo, HelpScreen]
    owners += [spec.factory for spec in views()]
    return {
        binding.id
        for owner in owners
        for binding in getattr(owner, "BINDINGS", [])
        if isinstance(binding, Binding) and binding.id
    }


def parse_refresh(text: str) -> float:
    ms = parse_duration(text, what="refresh interval") if text[-1:].isalpha() else None
    if ms is None:
        try:
            ms = int(float(text) * 1000)
        except ValueError:
            raise InvalidInput(
                f"refresh interval {text!r} is not a duration: use e.g. 500ms, 1s or 0.5"
            ) from None
    if not MIN_REFRESH_MS <= ms <= MAX_REFRESH_MS:
        raise InvalidInput(f"refresh interval {text!r} is out of range: use 100ms to 60s")
    return ms / 1000


def console(
    ctx: typer.Context,
    db_path: Annotated[
        Path | None,
        typer.Option(
            "--db", envvar="VORTOS_DB", help=f"SQLite database file [default: {DEFAULT_DB}]."
        ),
    ] = None,
    app_modules: Annotated[
        str | None,
        typer.Option(
            "--app",
            envvar="VORTOS_APP",
            help="Python module(s) with @schedulable commands and @scheduled schedules.",
        ),
    ] = None,
    allow_exec: Annotated[
        list[str] | None,
        typer.Option("--allow-exec", help="Executable the process command may run (repeat)."),
    ] = None,
    attach: Annotated[
        bool, typer.Option("--attach", help="Run no engine here: only the console.")
    ] = False,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Show every view but no verb (nothing can change).")
    ] = False,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="Add the demo schedules (tenant 'demo') if missing, and run their commands.",
        ),
    ] = False,
    web: Annotated[
        bool,
        typer.Option("--web", help="Serve the console to a browser on 127.0.0.1 (textual-serve)."),
    ] = False,
    web_allow_actions: Annotated[
        bool,
        typer.Option(
            "--web-allow-actions",
            help="Let browser sessions pause, resume and trigger (read-only otherwise).",
        ),
    ] = False,
    web_port: Annotated[
        int, typer.Option("--web-port", min=1, max=65535, help="Port for --web.")
    ] = DEFAULT_WEB_PORT,
    zone_name: Annotated[
        str | None,
        typer.Option("--zone", help="Show times in this IANA zone [default: the system's]."),
    ] = None,
    refresh: Annotated[
        str, typer.Option("--refresh", help="How often the view is read again.")
    ] = f"{int(DEFAULT_REFRESH_S * 1000)}ms",
    keymap: Annotated[
        Path | None,
        typer.Option("--keymap", help='TOML file remapping keys by binding id: [keys] pause = "P"'),
    ] = None,
    node_id: NodeId = None,
    lease_ttl: Annotated[
        str, typer.Option("--lease-ttl", help="Leader lease time to live (engine here).")
    ] = "15s",
    consumers: Consumers = 4,
    claim_ttl: ClaimTtl = "60s",
    operator_label: Annotated[
        str | None, typer.Option("--operator-label", hidden=True)  # web sessions: "alice (web)"
    ] = None,
    log_file: Annotated[
        Path | None,
        typer.Option(
            "--log-file",
            help="Write the engine's log here; otherwise only warnings show, as notices.",
        ),
    ] = None,
) -> None:
    """The operations console: schedules due soonest first, live fires, run and schedule
    detail; pause, resume and trigger with a confirmation. Keys as in k9s (? for help)."""
    root = ctx.find_root().obj
    cli = root if isinstance(root, CliState) else CliState(db=Path(DEFAULT_DB))
    if db_path is not None:
        cli.db = db_path
    if app_modules is not None:
        cli.app = app_modules
    cli.allow_exec += list(allow_exec or [])
    zone_info = local_zone(zone_name)
    refresh_s = parse_refresh(refresh)
    check_node_id(node_id)
    ttl = parse_duration(lease_ttl, what="lease TTL")
    if ttl < MIN_LEASE_TTL_MS:
        raise InvalidInput(f"lease TTL {format_duration(ttl)} is too short: use at least 1s")
    settings = consumer_settings(consumers, claim_ttl, "10s")
    keys = load_keymap(keymap, binding_ids())
    if log_file is not None and not log_file.parent.resolve().is_dir():
        raise InvalidInput(f"--log-file {log_file}: directory {log_file.parent} does not exist")
    if operator_label is not None and (
        len(operator_label) > 100 or not operator_label.isprintable()
    ):
        raise InvalidInput("--operator-label must be printable text of at most 100 characters")
    if demo and attach:
        raise InvalidInput("--demo runs the demo's commands here: leave out --attach")
    if web_allow_actions and not web:
        raise InvalidInput("--web-allow-actions goes with --web")
    if web and read_only and web_allow_actions:
        raise InvalidInput("--read-only and --web-allow-actions contradict each other")
    if web:
        serve(
            cli,
            port=web_port,
            allow_actions=web_allow_actions,
            attach=attach,
            demo=demo,
            zone_name=zone_info.key,
            refresh=refresh,
            node=node_id or default_node_id(),
            lease_ttl_ms=ttl,
            concurrency=settings.concurrency,
            claim_ttl_ms=settings.claim_ttl_ms,
            grace_ms=settings.grace_ms,
        )
        return
    run_console(
        cli,
        attach=attach,
        read_only=read_only,
        demo=demo,
        zone_info=zone_info,
        refresh_s=refresh_s,
        keymap=keys,
        node=node_id or default_node_id(),
        lease_ttl_ms=ttl,
        concurrency=settings.concurrency,
        claim_ttl_ms=settings.claim_ttl_ms,
        grace_ms=settings.grace_ms,
        log_file=log_file,
        operator_label=operator_label,
    )


def run_console(
    cli: CliState,
    *,
    attach: bool,
    read_only: bool,
    demo: bool,
    zone_info: ZoneInfo,
    refresh_s: float,
    keymap: dict[str, str],
    node: str,
    lease_ttl_ms: int,
    concurrency: int,
    claim_ttl_ms: int,
    grace_ms: int,
    log_file: Path | None,
    operator_label: str | None,
) -> None:
    commands = cli.commands()  # import the app (and refuse a broken one) before anything else
    if demo:
        demo_commands(commands)
    who = operator_label or operator()
    engine: Engine | None = None
    host: EngineHost | None = None
    if attach:
        # Refuse a missing or foreign file now, with the CLI's message, not as a banner.
        open_engine(cli.db, create=False, readonly=True, commands=commands).close()
    else:
        engine = open_engine(cli.db, create=True, commands=commands, enforce=True)
        engine.storage.audit.keys()  # no audit key, no dispatching: refuse now, not at a fire
        if cli.app is not None:
            engine.service.sync_static(cli.loaded_app().static, actor=who)
        if demo:
            seed_demo(engine, who)
    actions = None
    if not read_only:
        shared = engine
        actions = ConsoleActions(
            (lambda: shared)
            if shared is not None
            else (lambda: open_engine(cli.db, create=False, commands=commands, enforce=True)),
            who,
            owns_engine=shared is None,
        )
    context = ConsoleContext(
        db_label=str(cli.db),
        model=open_read_model(cli.db),
        clock=SystemClock(),
        zone=zone_info,
        operator=who,
        actions=actions,
        refresh_s=refresh_s,
    )
    app = VortosConsole(context, keymap=keymap)
    with route_logs(app, log_file):
        try:
            if engine is not None:
                host = EngineHost(
                    engine,
                    node_id=node,
                    lease_ttl_ms=lease_ttl_ms,
                    concurrency=concurrency,
                    claim_ttl_ms=claim_ttl_ms,
                    grace_ms=grace_ms,
                )
                context.node = host.status
                host.start()
            else:
                context.node = attached
            app.run()
        finally:
            if host is not None:
                busy = host.running_commands
                if busy:
                    say(
                        f"vortos-tui: {busy} command(s) still running: waiting up to "
                        f"{format_duration(grace_ms)} for them before giving their fires back"
                    )
                host.stop()
            if actions is not None:
                actions.close()
            if engine is not None:
                engine.close()
