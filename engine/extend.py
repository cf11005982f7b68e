"""The public surface for extending Vortos, under the name the README and 0.x code import.

This is engine.plugins, the same names and the same objects (see its docstring: the ports,
their settings, entry-point groups and conformance suites, and the versioning promise), kept
as `engine.extend` because the README's examples and plug-ins written against 0.x import it
from here. Both names are the public surface, under the same versioning.
"""

from __future__ import annotations

from engine import plugins as _plugins

# Every public name of engine.plugins, by definition: one list, kept there.
from engine.plugins import *  # noqa: F403

__all__ = list(_plugins.__all__)
