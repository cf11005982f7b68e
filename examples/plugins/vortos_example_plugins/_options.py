"""Reading a plug-in's `[plugin.<name>]` table: the one path option both plug-ins take."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.extend import PluginContext, PluginError


def path_option(
    context: PluginContext, option: str, beside_db_file: Callable[[Path], Path], example: str
) -> Path:
    """The path the plug-in's `option` gives, or the default `beside_db_file` derives from a
    SQLite database's file. A PostgreSQL database has no file to derive one from, so there the
    option is required. Unknown options are refused rather than ignored: a misspelt option
    would otherwise silently put the plug-in's files somewhere else."""
    unknown = sorted(set(context.options) - {option})
    if unknown:
        raise PluginError(
            f"{context.setting} = {context.name!r}: unknown option(s) {', '.join(unknown)} in "
            f"[plugin.{context.name}]; the only option is {option}"
        )
    value = context.options.get(option)
    if value is None:
        if isinstance(context.db, Path):
            return beside_db_file(context.db)
        raise PluginError(
            f"{context.setting} = {context.name!r}: the database is PostgreSQL, so there is no "
            f"database file to keep this plug-in's files beside; set [plugin.{context.name}] "
            f'{option} = "{example}" in vortos.toml'
        )
    if not isinstance(value, str) or not value.strip():
        raise PluginError(
            f"{context.setting} = {context.name!r}: [plugin.{context.name}] {option} must be a "
            f'path (a non-empty string such as "{example}"), not {value!r}'
        )
    return Path(value).expanduser()
