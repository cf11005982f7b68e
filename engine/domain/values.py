"""The shapes of data that crosses a boundary as it is: JSON (payloads, reports) and TOML (a
plug-in's options table), typed as what they can hold rather than as Any."""

from __future__ import annotations

from datetime import date, datetime, time
from typing import TypeAlias

# What json.loads can return, and what json.dumps is given back.
JsonValue: TypeAlias = str | int | float | bool | list["JsonValue"] | dict[str, "JsonValue"] | None

# What tomllib.loads can return for a value: TOML has no null, and has dates and times.
TomlValue: TypeAlias = (
    str | int | float | bool | datetime | date | time | list["TomlValue"] | dict[str, "TomlValue"]
)
