"""Shared CLI state: which database, which app's commands, who is acting."""

from __future__ import annotations

import logging
import os
import pwd
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import typer
from typer._click.core import ParameterSource

from engine import App, CommandRegistry, Engine, ProcessAllowlist, builtin_commands, load_app
from engine.api import EngineConfig, build_engine
from engine.config import BY_NAME, Settings, load_settings
from engine.domain.database import Database
from engine.domain.errors import DatabaseUnavailable
from engine.plugins.registry import Selection, select_plugins


@dataclass(slots=True)
class CliState:
    db: Database  # --db / VORTOS_DB / vortos.toml, parsed (a SQLite file, a database URL)
    app: str | None = None  # --app / VORTOS_APP: modules with @schedulable commands
    allow_exec: list[str] = field(default_factory=list)  # --allow-exec, beside VORTOS_PROCESS_ALLOW
    # --control-socket / VORTOS_CONTROL_SOCKET: changes go through `vortos run`'s socket
    control_socket: Path | None = None
    settings: Settings = field(default_factory=load_settings)
    # `vortos run` and `vortos consume`: this process runs fires, whatever control socket the
    # environment names, so its process command uses this process's (the owner's) allowlists.
    serving: bool = False
    _app: App | None = None
    _commands: CommandRegistry | None = None
    _plugins: Selection | None = None

    def loaded_app(self) -> App:
        """The app's commands and static schedules (imported once per invocation)."""
        if self._app is None:
            self._app = App() if self.app is None else load_app(self.app)
        return self._app

    def override(self, **values: Any) -> None:
        """Replace settings with a command's own flags (`vortos run --lease-driver`,
        `--approval-ttl`), for the rest of the invocation: the engine and the plug-ins are
        built from them."""
        self.settings = replace(self.settings, **values)  # each keeps the source it had
        self._plugins = None

    def plugins(self) -> Selection:
        """Every plug-in the settings name, imported (once per invocation): a missing or
        broken one is an InvalidInput here, before anything is opened."""
        if self._plugins is None:
            self._plugins = select_plugins(self.settings)
        return self._plugins

    def commands(self) -> CommandRegistry:
        """The built-in commands, with the process allowlists, and the app's."""
        if self._commands is None:
            registry = builtin_commands(self.process_allowlist())
            self._commands = self.loaded_app().register_into(registry)
            # The owner's list of sensitive commands joins those declared so in code.
            self._commands.protect(self.settings.sensitive_commands)
        return self._commands

    def process_allowlist(self) -> ProcessAllowlist:
        """What a process payload may name: the executables of VORTOS_PROCESS_ALLOW and
        --allow-exec, and the settings process_env_allow and process_cwd_allow. A control
        socket's client checks none of these lists: the server checks every payload against
        its own, so an operator's environment can neither widen nor narrow them."""
        if self.control_socket is not None and not self.serving:
            return ProcessAllowlist.for_control_client()
        return ProcessAllowlist.from_env(
            self.allow_exec,
            env=self.settings.process_env_allow,
            cwd=self.settings.process_cwd_allow,
        )


def given_flags(ctx: typer.Context, names: Mapping[str, str]) -> dict[str, Any]:
    """{setting: value} of the parameters given on the command line (not defaulted), for the
    settings they override; `names` maps parameter names to setting names."""
    given = {}
    for param, setting in names.items():
        if ctx.get_parameter_source(param) is ParameterSource.COMMANDLINE:
            given[setting] = ctx.params[param]
    return given


def configured(ctx: typer.Context, param: str, setting: str | None = None) -> Any:
    """A command's option as given on its command line, else the setting of that name (from
    vortos.toml, VORTOS_*, or its default): the option's text as typed, or the setting's
    value shown the same way (durations as text), so one parser reads both."""
    if ctx.get_parameter_source(param) is ParameterSource.COMMANDLINE:
        return ctx.params[param]
    name = setting or param
    value = getattr(state(ctx).settings, name)
    chosen = BY_NAME[name]
    if chosen.secret or chosen.shown is str or value is None:
        return value  # a URL as given: its shown form hides the password it connects with
    return chosen.shown(value)


def state(ctx: typer.Context) -> CliState:
    value = ctx.find_root().obj
    assert isinstance(value, CliState)
    return value


def open_for_write(ctx: typer.Context) -> Engine:
    """Every change is authorised by the operator's roles (the OS account running the CLI).
    With a control socket, changes go through it (the database must exist)."""
    cli = state(ctx)
    if cli.control_socket is not None:
        return open_existing(ctx)
    return _open(cli, create=True)


def open_existing(ctx: typer.Context) -> Engine:
    """For changes to what is stored: a missing database is an error, not created. With a
    control socket, this process opens no database: reads and changes go through the socket."""
    cli = state(ctx)
    return _open(cli, create=False, control_socket=cli.control_socket)


# A service starting while its database server is down, restarting, or cutting its sessions
# waits for it, backing off like this (about a minute in all) before it gives up.
START_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0)
_log = logging.getLogger("vortos.run")


def open_to_serve(ctx: typer.Context, *, node_id: str | None = None, retry: bool = True) -> Engine:
    """For `vortos run` and `vortos consume`: the process that owns the database opens it
    itself, whatever VORTOS_CONTROL_SOCKET says (it may be the one serving that socket).
    Its daemons lead with the lease driver of `cli.plugins()` (the command's --lease-driver
    given to `cli.override` first). A server that cannot be reached, or a session lost while
    opening (DatabaseUnavailable), is tried again with backoff (START_BACKOFF_S), said so;
    anything else (a wrong URL scheme, database, user or password) fails at once. `retry`
    False: one try (the caller retries its whole start-up, as `vortos run` does)."""
    for backoff in (*START_BACKOFF_S, None) if retry else (None,):
        try:
            return _open_once(state(ctx), node_id)
        except DatabaseUnavailable as exc:
            if backoff is None:
                raise
            _log.warning("%s; retrying in %.1f s", exc, backoff)
            time.sleep(backoff)  # start-up: nothing else to do until the server answers
    raise AssertionError("unreachable")  # pragma: no cover - the last try returns or raises


def _open_once(cli: CliState, node_id: str | None) -> Engine:
    engine = _open(cli, create=True, node_id=node_id)
    try:
        # A node whose audit key is not the database's stops now, naming both keys, not at
        # its first fire.
        engine.storage.audit.establish()
    except BaseException:
        engine.close()
        raise
    return engine


def _open(
    cli: CliState,
    *,
    create: bool,
    control_socket: Path | None = None,
    node_id: str | None = None,
) -> Engine:
    """An engine that checks access with the selected policy, with the settings' audit key
    file; four-eyes requests it makes stay open for the approval_ttl setting (through a
    control socket, the server's)."""
    config = EngineConfig.from_settings(
        cli.settings,
        database=cli.db,
        plugins=cli.plugins(),
        commands=cli.commands(),
        create=create,
        enforce=True,
        control_socket=control_socket,
        node_id=node_id,
    )
    return build_engine(config)


def open_for_read(ctx: typer.Context) -> Engine:
    """Reads see only the tenants the operator may view (by the selected policy). With a
    control socket, the database is not opened at all: the socket's server reads, as this
    account, narrowed to what it may view."""
    cli = state(ctx)
    if cli.control_socket is not None:
        return open_existing(ctx)
    config = EngineConfig.from_settings(
        cli.settings,
        database=cli.db,
        plugins=cli.plugins(),
        create=False,
        readonly=True,
        enforce=True,
    )
    return build_engine(config)


def operator() -> str:
    """The acting operator: the account this process runs as, by its real uid, as the kernel
    knows it. Not $USER or $LOGNAME, which anyone can set to anything."""
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without an account name (a container's, say)
        return f"uid-{uid}"
