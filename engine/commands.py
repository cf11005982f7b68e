"""Commands: what a fire runs. Only registered commands can be scheduled (the allowlist).

The execution issue adds `@schedulable` user commands and the `process` command; the built-ins
`noop` and `echo` let the engine, the demo and smoke tests work before that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.domain.errors import InvalidInput
from engine.domain.schedule import validate_name

log = logging.getLogger("vortos.commands")


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    run: Callable[..., Any]
    description: str


class CommandRegistry:
    """The allowlist of commands by name."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}

    def register(self, name: str, run: Callable[..., Any], description: str = "") -> None:
        validate_name(name, what="command name")
        if name in self._commands:
            raise InvalidInput(f"command {name!r} is registered twice")
        self._commands[name] = Command(name, run, description)

    def get(self, name: str) -> Command:
        try:
            return self._commands[name]
        except KeyError:
            known = ", ".join(sorted(self._commands)) or "none"
            raise InvalidInput(
                f"unknown command {name!r}: only registered commands can be scheduled "
                f"(known: {known})"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._commands)


def _noop(**_payload: Any) -> None:
    """Does nothing: for schedules that only mark time."""


def _echo(**payload: Any) -> Mapping[str, Any]:
    """Logs its payload and returns it."""
    log.info("echo %s", payload)
    return payload


def builtin_commands() -> CommandRegistry:
    registry = CommandRegistry()
    registry.register("noop", _noop, "does nothing")
    registry.register("echo", _echo, "logs its payload")
    return registry
