"""`vortos-tui` (and `vortos tui`): open the console, with the engine beside it by default."""

from __future__ import annotations

import logging
import os
import tomllib
from pathlib import Path
from typing import Annotated
from zoneinfo import ZoneInfo

import typer

from engine import DEFAULT_DB, InvalidInput
from engine.api import default_node_id
from engine.domain.database import parse_database
from engine.domain.redact import redact_url
from engine.domain.timeutil import format_duration, parse_duration, zone
from engine.runtime.daemon import MIN_LEASE_TTL_MS
from vortos_tui.cli.context import CliState
from vortos_tui.cli.workers import ClaimTtl, Consumers, NodeId, check_node_id, consumer_settings
from vortos_tui.console.context import DEFAULT_REFRESH_S

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
        str | None,
        typer.Option(
            "--db",
            envvar="VORTOS_DB",
            help=f"SQLite database file, or a postgresql:// URL [default: {DEFAULT_DB}].",
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
    control_socket: Annotated[
        Path | None,
        typer.Option(
            "--control-socket",
            envvar="VORTOS_CONTROL_SOCKET",
            help="Attach, and send every change through this `vortos run --control-socket`, "
            "which makes it as your account.",
        ),
    ] = None,
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
    cli = root if isinstance(root, CliState) else CliState(db=parse_database(DEFAULT_DB))
    if db_path is not None:
        try:
            cli.db = parse_database(db_path)
        except ValueError as exc:
            raise InvalidInput(f"--db {redact_url(db_path)!r}: {exc}") from None
    if app_modules is not None:
        cli.app = app_modules
    cli.allow_exec += list(allow_exec or [])
    if control_socket is not None:
        cli.control_socket = control_socket
    zone_info = local_zone(zone_name)
    refresh_s = parse_refresh(refresh)
    check_node_id(node_id)
    ttl = parse_duration(lease_ttl, what="lease TTL")
    if ttl < MIN_LEASE_TTL_MS:
        raise InvalidInput(f"lease TTL {format_duration(ttl)} is too short: use at least 1s")
    settings = consumer_settings(consumers, claim_ttl, "10s")
    # Textual loads here, when the console is asked for, not whenever `vortos` starts.
    from vortos_tui.console import launch  # noqa: PLC0415

    keys = load_keymap(keymap, launch.binding_ids())
    if log_file is not None and not log_file.parent.resolve().is_dir():
        raise InvalidInput(f"--log-file {log_file}: directory {log_file.parent} does not exist")
    if operator_label is not None and (
        len(operator_label) > 100 or not operator_label.isprintable()
    ):
        raise InvalidInput("--operator-label must be printable text of at most 100 characters")
    if demo and attach:
        raise InvalidInput("--demo runs the demo's commands here: leave out --attach")
    if demo and cli.control_socket is not None:
        raise InvalidInput(
            "--demo runs the demo's commands here; with a control socket the engine runs in "
            "`vortos run`: leave out one of them (or unset VORTOS_CONTROL_SOCKET)"
        )
    if web_allow_actions and not web:
        raise InvalidInput("--web-allow-actions goes with --web")
    if web and read_only and web_allow_actions:
        raise InvalidInput("--read-only and --web-allow-actions contradict each other")
    if web:
        from vortos_tui.console.web import serve  # noqa: PLC0415 - loads textual-serve

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
    launch.run_console(
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
