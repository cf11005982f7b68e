"""The public extension API (engine.plugins, alias engine.extend) has no `typing.Any` in it.

For every exported name, the type hints of its fields, of its methods' and properties'
parameters and return values are walked (typing.get_type_hints), through unions, generics,
callables and recursive aliases, into every Protocol they reach and every class of the API's
own modules (the plug-in package, the ports, the settings). A place where Any occurs fails,
named as module.Class.member(parameter)[argument index...].

KNOWN lists the places that are still Any because their fix belongs to a file another person
owns; each says what it waits for. The test also fails when one of them is no longer Any, so
the list only shrinks.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from collections.abc import Callable, Iterator

import engine.extend
import engine.plugins

# Classes from these modules are walked whenever a hint reaches them; elsewhere only
# Protocols are (a domain value type such as Schedule is walked only when it is exported).
OWN_MODULES = ("engine.plugins", "engine.ports", "engine.config", "engine.settings_values")

KNOWN = {
    # engine/domain/audit.py: an entry's event data is free-form JSON (JsonValue would do).
    "engine.domain.audit.AuditEntry.data[1]",
    "engine.domain.audit.AuditEntry.__init__(data)[1]",
    "engine.domain.audit.AuditEntry.from_json(value)[1]",
    "engine.domain.audit.AuditEntry.to_json(return)[1]",
    # dict[str, JsonValue] needs str() around describe()["path"] at
    # tests/integration/test_plugin_runtime.py:53.
    "engine.ports.storage.Storage.describe(return)[1]",
}


class Walk:
    """Every place of Any reached from the exported names."""

    def __init__(self) -> None:
        self.found: list[str] = []
        self.seen: set[type] = set()
        self.aliases: set[str] = set()  # recursive aliases already walked, by name

    def hint(self, hint: object, where: str, namespace: dict[str, object]) -> None:
        if hint is typing.Any:
            self.found.append(where)
            return
        if isinstance(hint, str | typing.ForwardRef):
            self.forward(hint, where, namespace)
            return
        if isinstance(hint, typing.TypeVar):
            for i, bound in enumerate([hint.__bound__, *hint.__constraints__]):
                self.hint(bound, f"{where}<{i}>", namespace)
            return
        if typing.get_origin(hint) is typing.Literal:
            return
        for i, arg in enumerate(typing.get_args(hint)):
            if isinstance(arg, list):  # Callable[[A, B], R] holds its parameters as a list
                for j, parameter in enumerate(arg):
                    self.hint(parameter, f"{where}[{i}][{j}]", namespace)
            else:
                self.hint(arg, f"{where}[{i}]", namespace)
        origin = typing.get_origin(hint) or hint
        if isinstance(origin, type) and walked(origin):
            self.cls(origin)

    def forward(
        self, ref: str | typing.ForwardRef, where: str, namespace: dict[str, object]
    ) -> None:
        """A name left as text: the back-reference of a recursive alias (JsonValue in
        list["JsonValue"]), walked once per name."""
        name = ref if isinstance(ref, str) else ref.__forward_arg__
        if name in self.aliases:
            return
        self.aliases.add(name)
        assert name in namespace, f"{where}: cannot resolve {name!r}"
        self.hint(namespace[name], where, namespace)

    def cls(self, cls: type) -> None:
        if cls in self.seen:
            return
        self.seen.add(cls)
        name = f"{cls.__module__}.{cls.__qualname__}"
        namespace = vars(sys.modules[cls.__module__])
        for field, hint in typing.get_type_hints(cls).items():
            self.hint(hint, f"{name}.{field}", namespace)
        for member, function in members(cls):
            hints = typing.get_type_hints(function)
            for parameter, hint in hints.items():
                self.hint(hint, f"{name}.{member}({parameter})", function_namespace(function))


def walked(cls: type) -> bool:
    if not cls.__module__.startswith("engine"):
        return False
    return bool(getattr(cls, "_is_protocol", False)) or cls.__module__.startswith(OWN_MODULES)


def members(cls: type) -> Iterator[tuple[str, Callable[..., object]]]:
    """The public methods and properties of `cls` written in Python, with __init__ and
    __call__ (a dataclass's generated __init__ included)."""
    for member, value in inspect.getmembers(cls):
        if member.startswith("_") and member not in ("__init__", "__call__"):
            continue
        function = value.fget if isinstance(value, property) else value
        if isinstance(function, classmethod | staticmethod):
            function = function.__func__
        if inspect.isfunction(function) or inspect.ismethod(function):
            yield member, function


def function_namespace(function: Callable[..., object]) -> dict[str, object]:
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    return {} if module is None else vars(module)


def any_places() -> list[str]:
    walk = Walk()
    for name in engine.plugins.__all__:
        exported = getattr(engine.plugins, name)
        if isinstance(exported, type):
            walk.cls(exported)
        else:
            hints = typing.get_type_hints(exported)
            for parameter, hint in hints.items():
                walk.hint(hint, f"{name}({parameter})", function_namespace(exported))
    return walk.found


def test_engine_extend_is_the_same_surface_as_engine_plugins() -> None:
    assert engine.extend.__all__ == engine.plugins.__all__
    for name in engine.plugins.__all__:
        assert getattr(engine.extend, name) is getattr(engine.plugins, name), name


def test_no_any_in_the_public_extension_api() -> None:
    places = [p for p in any_places() if p not in KNOWN]

    assert places == [], "typing.Any in the public extension API at:\n" + "\n".join(places)


def test_every_known_any_is_still_there() -> None:
    fixed = sorted(KNOWN - set(any_places()))

    assert fixed == [], "no longer Any, remove from KNOWN: " + ", ".join(fixed)


def test_the_walk_reaches_the_ports_and_the_settings() -> None:
    walk = Walk()
    for name in engine.plugins.__all__:
        exported = getattr(engine.plugins, name)
        if isinstance(exported, type):
            walk.cls(exported)
    reached = {f"{c.__module__}.{c.__qualname__}" for c in walk.seen}

    assert {
        "engine.config.Settings",
        "engine.ports.storage.Storage",
        "engine.ports.schedules.ScheduleStore",
        "engine.ports.fire_queue.Fire",
        "engine.plugins.registry.Selection",
    } <= reached


def test_the_walk_finds_an_any_where_there_is_one() -> None:
    @dataclasses.dataclass
    class Loose:
        payload: dict[str, typing.Any]

        def call(self, hook: Callable[[typing.Any], None]) -> list[typing.Any]:
            return []

    walk = Walk()
    walk.cls(Loose)

    assert sorted(p.rsplit(".", 1)[-1] for p in walk.found) == [
        "__init__(payload)[1]",
        "call(hook)[0][0]",
        "call(return)[0]",
        "payload[1]",
    ]
