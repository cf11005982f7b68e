"""Starting the console: the Textual app, the engine beside it, the logs. Kept apart from
the option parsing so that `vortos` (the CLI) never loads Textual unless `vortos tui` runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from textual.binding import Binding

from engine import Engine, ReadModel, SystemClock, open_engine, open_read_model
from engine.control import ControlClient
from engine.control.read_model import SocketReadModel
from engine.domain.database import shown
from engine.domain.timeutil import format_duration
from engine.governance.policy import RoleBasedPolicy
from engine.ports.policy import Policy
from vortos_tui.cli.context import CliState, operator
from vortos_tui.cli.demo import demo_commands, seed_demo
from vortos_tui.cli.doctor import run_doctor
from vortos_tui.cli.output import say
from vortos_tui.cli.workers import Telemetry, start_plugins
from vortos_tui.console.actions import ConsoleActions
from vortos_tui.console.app import VortosConsole
from vortos_tui.console.context import ConsoleContext, attached
from vortos_tui.console.decide import ConfirmDecision
from vortos_tui.console.dialogs import ConfirmVerb, HelpScreen, JumpTo
from vortos_tui.console.engine_host import EngineHost
from vortos_tui.console.logs import route_logs
from vortos_tui.console.views.base import LiveView
from vortos_tui.console.views.registry import views
from vortos_tui.console.views.run_detail import RunDetailView
from vortos_tui.console.views.schedule_detail import ScheduleDetailView
from vortos_tui.console.widgets import FilterBar


def binding_ids() -> set[str]:
    """Every binding id of the console, its views and its dialogs (what a keymap may name)."""
    owners: list[Any] = [VortosConsole, LiveView, ScheduleDetailView, RunDetailView, FilterBar]
    owners += [ConfirmVerb, ConfirmDecision, JumpTo, HelpScreen]
    owners += [spec.factory for spec in views()]
    return {
        binding.id
        for owner in owners
        for binding in getattr(owner, "BINDINGS", [])
        if isinstance(binding, Binding) and binding.id
    }


def _reads(
    cli: CliState, who: str, deciding: Engine | None, served: ControlClient | None
) -> tuple[Policy, ReadModel]:
    """The policy that decides what the console offers, and its read model. One policy, the
    selected one, decides what the reads show and which verbs are offered. Through a control
    socket the server's policy narrows the reads and decides every verb; the verbs offered
    here follow the roles."""
    if served is not None:
        return RoleBasedPolicy(), SocketReadModel(served)
    assert deciding is not None
    assert deciding.service.access is not None
    policy = deciding.service.access.policy
    return policy, open_read_model(cli.db, operator=who, policy=policy)


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
    plugins = cli.plugins()  # and every plug-in the settings name
    if demo:
        demo_commands(commands)
    # The label only names the session on screen (web: "alice (web)"); every read and every
    # change is the OS account's, whatever the label says.
    who = operator()
    engine: Engine | None = None
    host: EngineHost | None = None
    # With a control socket the engine is `vortos run`'s, and every read and change goes
    # through it: this process opens no database file.
    attach = attach or cli.control_socket is not None
    served = None if cli.control_socket is None else ControlClient(cli.control_socket)
    if served is not None:
        served.call("hello")  # a stopped service: refuse now, with its message
    # Refuses a missing or foreign file now, with the CLI's message, not as a banner; its
    # access control holds the selected policy, which decides what the console shows.
    reader = (
        open_engine(
            cli.db,
            create=False,
            readonly=True,
            commands=commands,
            enforce=True,
            plugins=plugins,
            settings=cli.settings,
        )
        if attach and served is None
        else None
    )
    if not attach:
        engine = open_engine(
            cli.db,
            create=True,
            commands=commands,
            enforce=True,
            audit_key_file=cli.settings.audit_key_file,
            plugins=plugins,
            settings=cli.settings,
            node_id=node,
        )
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
            else (
                lambda: open_engine(
                    cli.db,
                    create=False,
                    commands=commands,
                    enforce=True,
                    control_socket=cli.control_socket,
                    plugins=plugins,
                    settings=cli.settings,
                )
            ),
            who,
            owns_engine=shared is None,
        )
    policy, model = _reads(cli, who, engine or reader, served)
    context = ConsoleContext(
        db_label=shown(cli.db),
        model=model,
        clock=SystemClock(),
        zone=zone_info,
        operator=who,
        operator_label=operator_label,
        actions=actions,
        refresh_s=refresh_s,
        policy=policy,
        doctor=lambda: run_doctor(cli),
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
                    plugins=start_plugins(engine, cli, node, Telemetry(), ship_audit=True),
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
            if reader is not None:
                reader.close()
