"""Shared CLI state: which database, which app's commands, who is acting."""

from __future__ import annotations

import getpass
from dataclasses import dataclass, field
from pathlib import Path

import typer

from engine import (
    App,
    CommandRegistry,
    Engine,
    ProcessAllowlist,
    builtin_commands,
    load_app,
    open_engine,
)


@dataclass(slots=True)
class CliState:
    db: Path
    app: str | None = None  # --app / VORTOS_APP: modules with @schedulable commands
    allow_exec: list[str] = field(default_factory=list)  # --allow-exec, beside VORTOS_PROCESS_ALLOW
    _app: App | None = None
    _commands: CommandRegistry | None = None

    def loaded_app(self) -> App:
        """The app's commands and static schedules (imported once per invocation)."""
        if self._app is None:
            self._app = App() if self.app is None else load_app(self.app)
        return self._app

    def commands(self) -> CommandRegistry:
        """The built-in commands, with the process allowlist, and the app's."""
        if self._commands is None:
            registry = builtin_commands(ProcessAllowlist.from_env(self.allow_exec))
            self._commands = self.loaded_app().register_into(registry)
        return self._commands


def state(ctx: typer.Context) -> CliState:
    value = ctx.find_root().obj
    assert isinstance(value, CliState)
    return value


def open_for_write(ctx: typer.Context) -> Engine:
    """Every change is authorised by the operator's roles (the OS account running the CLI)."""
    cli = state(ctx)
    return open_engine(cli.db, create=True, commands=cli.commands(), enforce=True)


def open_existing(ctx: typer.Context) -> Engine:
    """For changes to what is stored: a missing database is an error, not created."""
    cli = state(ctx)
    return open_engine(cli.db, create=False, commands=cli.commands(), enforce=True)


def open_for_read(ctx: typer.Context) -> Engine:
    """Reads see only the tenants the operator may view."""
    return open_engine(state(ctx).db, create=False, readonly=True, enforce=True)


def operator() -> str:
    """The acting operator: the OS account running the CLI."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
