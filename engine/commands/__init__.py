"""Commands: what a fire runs. Only registered commands can be scheduled (the allowlist)."""

from engine.commands.app import APP_ENV, App, load_app
from engine.commands.builtins import builtin_commands
from engine.commands.context import (
    CommandCancelled,
    CommandFailed,
    CommandResult,
    FireContext,
    PermanentFailure,
    RescheduleFire,
)
from engine.commands.decorators import StaticSchedule, schedulable, scheduled
from engine.commands.process import ProcessAllowlist
from engine.commands.registry import Command, CommandRegistry

__all__ = [
    "APP_ENV",
    "App",
    "Command",
    "CommandCancelled",
    "CommandFailed",
    "CommandRegistry",
    "CommandResult",
    "FireContext",
    "PermanentFailure",
    "ProcessAllowlist",
    "RescheduleFire",
    "StaticSchedule",
    "builtin_commands",
    "load_app",
    "schedulable",
    "scheduled",
]
