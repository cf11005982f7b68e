"""The `/` filter: words match a name; `tenant:T` and `state:S` match exactly."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from engine import InvalidInput

MAX_FILTER = 200


@dataclass(frozen=True, slots=True)
class Filter:
    text: str | None = None
    tenant: str | None = None
    state: str | None = None

    @property
    def spelled(self) -> str:
        parts = [] if self.text is None else [self.text]
        if self.tenant is not None:
            parts.append(f"tenant:{self.tenant}")
        if self.state is not None:
            parts.append(f"state:{self.state}")
        return " ".join(parts)


def parse_filter(raw: str, states: Collection[str]) -> Filter:
    """Parse what the operator typed; an unknown key or state is refused with the choices."""
    if len(raw) > MAX_FILTER:
        raise InvalidInput(f"the filter is {len(raw)} characters: at most {MAX_FILTER}")
    words: list[str] = []
    tenant = state = None
    for token in raw.split():
        key, sep, value = token.partition(":")
        if not sep:
            words.append(token)
            continue
        if not value:
            raise InvalidInput(f"{key}: needs a value, e.g. {key}:demo")
        if key == "tenant":
            tenant = value
        elif key == "state":
            wanted = value.lower().replace("-", "_").replace(" ", "_")
            if wanted not in states:
                raise InvalidInput(
                    f"unknown state {value!r}: use one of {', '.join(sorted(states))}"
                )
            state = wanted
        else:
            raise InvalidInput(f"unknown filter key {key!r}: use tenant:NAME or state:STATE")
    return Filter(" ".join(words) or None, tenant, state)
