"""The engine's parameters as this CLI's flags.

Engine messages name what a Python caller passes (`catch_up_cap=`, `confirmed=True`); a CLI user
reads the flag that sets it. Every error the CLI prints passes through `as_flags`.
"""

from __future__ import annotations

import re

# Parameter (as engine messages spell it) -> the flag that sets it.
FLAGS: dict[str, str] = {
    "cron=": "--cron",
    "every_ms=": "--every",
    "at_ms=": "--at",
    "start_ms=": "--start",
    "dst_repeated=": "--dst-repeated",
    "dst_missing=": "--dst-missing",
    "misfire=each": "--misfire each",
    "misfire=": "--misfire",
    "catch_up_cap=": "--catch-up-cap",
    "max_age_ms=": "--max-catch-up-age",
    "grace_ms=": "--misfire-grace",
    "jitter_ms=": "--jitter",
    "max_attempts=": "--max-attempts",
    "backoff_ms=": "--retry-backoff",
    "backoff_cap_ms=": "--retry-backoff-cap",
    "timeout_ms=": "--timeout",
    "expected_version=": "--expect-version",
    "confirmed=True": "--yes",
    "run_ids=None": "--all",
}

_PARAMETER = re.compile(
    r"(?<![\w-])(" + "|".join(re.escape(k) for k in sorted(FLAGS, key=len, reverse=True)) + ")"
)


def as_flags(message: str) -> str:
    """`message` with each engine parameter written as the CLI flag that sets it."""
    return _PARAMETER.sub(lambda m: FLAGS[m.group(1)], message)
