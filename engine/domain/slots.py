"""Slot keys and per-slot jitter.

A slot key names one slot of one schedule: the schedule's id and the slot's local time *with its
UTC offset*, so the two passes of a repeated hour have different keys. It is the only thing that
decides whether a slot was already dispatched.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from engine.domain.timeutil import to_ms, zone
from engine.domain.wallclock import format_local

_MANUAL = "manual:"


def slot_key(schedule_id: str, at_ms: int, tz: str) -> str:
    """`<schedule id>@<local ISO-8601 time with offset>`."""
    return f"{schedule_id}@{format_local(at_ms, zone(tz))}"


def manual_slot_key(schedule_id: str, at_ms: int, nonce: str) -> str:
    """The key of a fire asked for by hand: never collides with a trigger's slot."""
    return f"{schedule_id}@{_MANUAL}{at_ms}:{nonce}"


def slot_instant(key: str) -> int | None:
    """The instant a slot key names (every key spells its instant), or None for a string that
    is not a slot key."""
    _, at, when = key.partition("@")
    if not at:
        return None
    if when.startswith(_MANUAL):
        number = when[len(_MANUAL) :].partition(":")[0]
        return int(number) if number.lstrip("-").isdigit() else None
    try:
        moment = datetime.fromisoformat(when)
    except ValueError:
        return None
    return None if moment.tzinfo is None else to_ms(moment)


def jitter_offset_ms(key: str, jitter_ms: int) -> int:
    """A stable offset in [0, jitter_ms] for the slot: every node computes the same one."""
    if jitter_ms <= 0:
        return 0
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (jitter_ms + 1)
