"""`vortos-tui --web`: the same console in a browser, through textual-serve.

textual-serve has no authentication, so it listens on the loopback interface only (reach it
through an SSH tunnel) and its sessions are read-only unless --web-allow-actions is given. Each
browser session runs its own attached console; the engine, unless --attach, runs here, once.
"""

from __future__ import annotations

import os
import shlex
import sys

from engine import CommandRegistry, Engine, InvalidInput, open_engine
from engine.plugins.registry import Selection
from vortos_tui.cli.context import CliState, operator
from vortos_tui.cli.demo import demo_commands, seed_demo
from vortos_tui.cli.output import say
from vortos_tui.cli.workers import Telemetry, start_plugins
from vortos_tui.console.engine_host import EngineHost

WEB_HOST = "127.0.0.1"


def session_command(
    cli: CliState, *, allow_actions: bool, zone_name: str, refresh: str
) -> list[str]:
    """The console each browser session runs: attached to the same database. A database URL
    goes to the sessions as VORTOS_DB (see `serve`), never in their argv, which every local
    account can read in the process list."""
    argv = [sys.executable, "-m", "vortos_tui.console", "--attach"]
    if cli.db.path is not None:  # absolute: the served console's cwd may differ
        argv[3:3] = ["--db", str(cli.db.path.resolve())]
    argv += ["--zone", zone_name, "--refresh", refresh, "--operator-label", f"{operator()} (web)"]
    if cli.app is not None:
        argv += ["--app", cli.app]
    for path in cli.allow_exec:
        argv += ["--allow-exec", path]
    if cli.control_socket is not None:
        argv += ["--control-socket", str(cli.control_socket.resolve())]
    if not allow_actions:
        argv.append("--read-only")
    return argv


def serve(
    cli: CliState,
    *,
    port: int,
    allow_actions: bool,
    attach: bool,
    demo: bool,
    zone_name: str,
    refresh: str,
    node: str,
    lease_ttl_ms: int,
    concurrency: int,
    claim_ttl_ms: int,
    grace_ms: int,
) -> None:
    try:
        from textual_serve.server import Server  # noqa: PLC0415 - an optional extra
    except ImportError:
        raise InvalidInput("--web needs the web extra: pip install 'vortos[web]'") from None
    commands = cli.commands()
    plugins = cli.plugins()  # a missing or broken plug-in stops us before anything opens
    if demo:
        demo_commands(commands)
    engine, host = _engine_host(
        cli,
        commands,
        plugins,
        attach=attach or cli.control_socket is not None,  # the engine is `vortos run`'s
        demo=demo,
        node=node,
        lease_ttl_ms=lease_ttl_ms,
        concurrency=concurrency,
        claim_ttl_ms=claim_ttl_ms,
        grace_ms=grace_ms,
    )
    if not cli.db.is_file:
        os.environ["VORTOS_DB"] = cli.db.location  # the sessions' (textual-serve passes it on)
    command = shlex.join(
        session_command(cli, allow_actions=allow_actions, zone_name=zone_name, refresh=refresh)
    )
    mode = "actions ALLOWED" if allow_actions else "read-only (--web-allow-actions to allow verbs)"
    say(
        f"vortos console on http://{WEB_HOST}:{port} for {cli.db.shown}: {mode}; "
        f"loopback only (no authentication: reach it through an SSH tunnel); Ctrl-C stops"
    )
    try:
        Server(command, host=WEB_HOST, port=port, title="vortos").serve()
    finally:
        if host is not None:
            host.stop()
        if engine is not None:
            engine.close()


def _engine_host(
    cli: CliState,
    commands: CommandRegistry,
    plugins: Selection,
    *,
    attach: bool,
    demo: bool,
    node: str,
    lease_ttl_ms: int,
    concurrency: int,
    claim_ttl_ms: int,
    grace_ms: int,
) -> tuple[Engine | None, EngineHost | None]:
    """The engine this process runs and the host running its daemon and consumers; none
    when `attach`ed to another's (the database must exist then)."""
    if attach:
        open_engine(cli.db, create=False, readonly=True).close()
        return None, None
    engine = open_engine(
        cli.db,
        create=True,
        commands=commands,
        plugins=plugins,
        settings=cli.settings,
        node_id=node,
    )
    if demo:
        seed_demo(engine, operator())
    host = EngineHost(
        engine,
        node_id=node,
        lease_ttl_ms=lease_ttl_ms,
        concurrency=concurrency,
        claim_ttl_ms=claim_ttl_ms,
        grace_ms=grace_ms,
        plugins=start_plugins(engine, cli, node, Telemetry(), ship_audit=True),
    )
    host.start()
    return engine, host
