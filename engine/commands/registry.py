"""The allowlist of commands: only a registered command can be scheduled or run."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.commands.payload import PayloadSchema, schema_of
from engine.domain.errors import InvalidInput
from engine.domain.schedule import validate_name, validate_payload, validate_timeout

log = logging.getLogger("vortos.commands")

# Checks a payload beyond its schema (the process command's allowlist); returns it normalised.
PayloadCheck = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Command:
    """A callable a fire can run. `run` takes the payload's fields as keyword arguments, and
    the fire's FireContext under `schema.context_parameter` when it asks for one."""

    name: str
    run: Callable[..., Any]
    description: str
    schema: PayloadSchema
    check: PayloadCheck | None = None
    source: str = ""  # where it is defined, for operators
    # Every schedule running it needs four-eyes approval (@schedulable(sensitive=True)).
    sensitive: bool = False
    # How long one run may take unless its schedule says otherwise (@schedulable(timeout=));
    # None: no limit (engine.runtime.time_limits).
    timeout_ms: int | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.run) or inspect.iscoroutinefunction(
            getattr(self.run, "__call__", None)  # noqa: B004 (an async __call__ of an object)
        )

    def validate(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """The payload, checked against the command's parameters. Raises InvalidInput."""
        checked = self.schema.validate(self.name, validate_payload(dict(payload)))
        return checked if self.check is None else self.check(checked)


def command_from(
    name: str,
    run: Callable[..., Any],
    description: str = "",
    check: PayloadCheck | None = None,
    *,
    sensitive: bool = False,
    timeout_ms: int | None = None,
) -> Command:
    validate_name(name, what="command name")
    validate_timeout(timeout_ms, what=f"command {name!r} timeout")
    module = getattr(run, "__module__", None) or type(run).__module__
    qualname = getattr(run, "__qualname__", None) or type(run).__qualname__
    doc = description or (inspect.getdoc(run) or "").split("\n", 1)[0]
    return Command(
        name, run, doc, schema_of(run), check, f"{module}.{qualname}", sensitive, timeout_ms
    )


class CommandRegistry:
    """The allowlist of commands by name."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}
        # Names the service's owner declared sensitive (setting sensitive_commands): they hold
        # whether or not this process registered the command (a CLI run without --app).
        self._protected: frozenset[str] = frozenset()

    def protect(self, names: Iterable[str]) -> None:
        """Declare these commands sensitive, as the owner's settings do."""
        self._protected = self._protected | frozenset(names)

    def sensitivity(self, name: str) -> str | None:
        """Why every schedule running `name` needs a second operator, or None if it does not."""
        if name in self._protected:
            return "by the sensitive_commands setting"
        command = self._commands.get(name)
        if command is not None and command.sensitive:
            return f"in code ({command.source})"
        return None

    def register(
        self,
        name: str,
        run: Callable[..., Any],
        description: str = "",
        check: PayloadCheck | None = None,
    ) -> Command:
        command = command_from(name, run, description, check)
        self.add(command)
        return command

    def add(self, command: Command) -> None:
        existing = self._commands.get(command.name)
        if existing is not None and existing.run is not command.run:
            if existing.source.startswith("engine."):
                raise InvalidInput(
                    f"command name {command.name!r} ({command.source}) is taken by a built-in "
                    "command: give yours another name"
                )
            raise InvalidInput(
                f"command {command.name!r} is registered twice ({existing.source} and "
                f"{command.source}): give one of them another name"
            )
        self._commands[command.name] = command

    def get(self, name: str) -> Command:
        try:
            return self._commands[name]
        except KeyError:
            known = ", ".join(sorted(self._commands)) or "none"
            raise InvalidInput(
                f"unknown command {name!r}: only registered commands can be scheduled "
                f"(known: {known}); register Python commands with @schedulable and load them "
                "with --app"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._commands

    def validate(self, name: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Check that `name` is registered and `payload` fits its parameters."""
        return self.get(name).validate(payload)

    def names(self) -> list[str]:
        return sorted(self._commands)

    def commands(self) -> list[Command]:
        return [self._commands[n] for n in sorted(self._commands)]
