"""Loading a user's app: the modules named by `--app` / VORTOS_APP, and what they declare."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import dataclass, field
from types import ModuleType

from engine.commands.decorators import StaticSchedule, command_of, schedules_of
from engine.commands.registry import Command, CommandRegistry
from engine.domain.errors import InvalidInput

APP_ENV = "VORTOS_APP"


@dataclass(slots=True)
class App:
    """The commands and static schedules of the app's modules."""

    modules: list[str] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    static: list[StaticSchedule] = field(default_factory=list)

    def register_into(self, registry: CommandRegistry) -> CommandRegistry:
        for command in self.commands:
            registry.add(command)
        return registry


def load_app(spec: str) -> App:
    """Import each module of `spec` (comma-separated dotted names) and collect the module-level
    functions marked @schedulable / @scheduled. The current directory is importable, as it is
    for `python -m`."""
    app = App()
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise InvalidInput(f"--app / {APP_ENV} is empty: name a module, e.g. --app myjobs")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    seen: dict[str, Command] = {}
    for name in names:
        module = _import(name)
        app.modules.append(name)
        for value in vars(module).values():
            command = command_of(value)
            if command is None:
                continue
            other = seen.get(command.name)
            if other is not None and other.run is not command.run:
                raise InvalidInput(
                    f"command name {command.name!r} is used twice ({other.source} and "
                    f"{command.source}): give one of them another name"
                )
            if other is None:
                seen[command.name] = command
                app.commands.append(command)
                app.static.extend(schedules_of(value))
    _refuse_duplicate_static(app.static)
    return app


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise InvalidInput(
                f"cannot import app module {name!r}: no module named {exc.name!r}; check --app "
                f"/ {APP_ENV}, and run from the directory that holds it (or set PYTHONPATH)"
            ) from None
        raise InvalidInput(
            f"importing app module {name!r} failed: it imports {exc.name!r}, which is not "
            "installed here: install it in this environment, or fix the import"
        ) from None
    except SyntaxError as exc:
        raise InvalidInput(
            f"app module {name!r} has a syntax error at {exc.filename}:{exc.lineno}: {exc.msg}"
        ) from None
    except InvalidInput as exc:
        raise InvalidInput(f"app module {name!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 (the user's module may raise anything on import)
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise InvalidInput(
            f"importing app module {name!r} raised {type(exc).__name__}: {exc} "
            f"({where.filename}:{where.lineno})"
        ) from None


def _refuse_duplicate_static(static: list[StaticSchedule]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for s in static:
        key = (s.spec.tenant, s.spec.name)
        if key in seen:
            raise InvalidInput(
                f"two static schedules are named {s.spec.name!r} in tenant {s.spec.tenant!r} "
                f"({seen[key]} and {s.source}): pass name=... to @scheduled"
            )
        seen[key] = s.source
