"""The console's views by name. Adding a view is one module and one `register_view` call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.screen import Screen

from vortos_tui.console.context import ConsoleContext


@dataclass(frozen=True, slots=True)
class ViewSpec:
    name: str  # what `:` takes, and the mode's name
    title: str
    summary: str
    factory: Callable[[ConsoleContext], Screen[None]]
    aliases: tuple[str, ...] = ()
    order: int = 100  # place in the jumper, the help and the palette (lowest first)


_VIEWS: dict[str, ViewSpec] = {}


def register_view(spec: ViewSpec) -> ViewSpec:
    for name in (spec.name, *spec.aliases):
        owner = find_view(name)
        if owner is not None and owner.name != spec.name:
            raise ValueError(f"view name {name!r} is taken by the {owner.title} view")
    _VIEWS[spec.name] = spec
    return spec


def views() -> list[ViewSpec]:
    """By `order`, then in registration order (the jumper lists them so)."""
    return sorted(_VIEWS.values(), key=lambda spec: spec.order)


def find_view(name: str) -> ViewSpec | None:
    wanted = name.strip().lower().lstrip(":")
    for spec in _VIEWS.values():
        if wanted == spec.name or wanted in spec.aliases:
            return spec
    return None
