"""Retrying failed attempts: how many, and how long to wait before the next one."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from engine.domain.errors import InvalidInput
from engine.domain.timeutil import DAY_MS, SECOND_MS, format_duration

MAX_ATTEMPTS_LIMIT = 100
# Each delay grows by up to this share, so fires that failed together do not retry together.
JITTER_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A failed attempt is retried after `backoff_ms * 2**(n-1)` (at most `backoff_cap_ms`),
    plus up to a quarter of that as jitter (so fires that failed together spread out even at
    the cap), until `max_attempts` attempts were made; then the
    fire is dead-lettered. Attempts abandoned by a vanished consumer count too, so a command
    that kills its consumer cannot loop forever."""

    max_attempts: int = 3
    backoff_ms: int = 2 * SECOND_MS
    backoff_cap_ms: int = 5 * 60 * SECOND_MS

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise InvalidInput(
                f"max attempts {self.max_attempts} is out of range (max_attempts=): use 1 to "
                f"{MAX_ATTEMPTS_LIMIT}"
            )
        if not 0 <= self.backoff_ms <= DAY_MS:
            raise InvalidInput(
                f"retry backoff {format_duration(abs(self.backoff_ms))} is out of range "
                "(backoff_ms=): use 0 to 1d"
            )
        if not self.backoff_ms <= self.backoff_cap_ms <= DAY_MS:
            raise InvalidInput(
                f"the retry backoff cap {format_duration(self.backoff_cap_ms)} must be between "
                f"the backoff and 1d (backoff_cap_ms=; the backoff, backoff_ms=, is "
                f"{format_duration(self.backoff_ms)})"
            )

    def to_json(self) -> dict[str, int]:
        return {
            "max_attempts": self.max_attempts,
            "backoff_ms": self.backoff_ms,
            "backoff_cap_ms": self.backoff_cap_ms,
        }

    @classmethod
    def from_json(cls, value: dict[str, int]) -> RetryPolicy:
        default = cls()
        return cls(
            max_attempts=value.get("max_attempts", default.max_attempts),
            backoff_ms=value.get("backoff_ms", default.backoff_ms),
            backoff_cap_ms=value.get("backoff_cap_ms", default.backoff_cap_ms),
        )

    def exhausted(self, attempts: int) -> bool:
        """True when `attempts` attempts leave none to retry."""
        return attempts >= self.max_attempts

    def delay_ms(self, run_id: int, attempt: int) -> int:
        """The wait before the attempt after `attempt` (1-based). Stable per run and attempt."""
        base = min(self.backoff_cap_ms, self.backoff_ms * 2 ** min(max(attempt - 1, 0), 40))
        digest = hashlib.blake2b(f"{run_id}:{attempt}".encode(), digest_size=8).digest()
        share = int.from_bytes(digest, "big") / 2**64 * JITTER_SHARE
        return int(base + int(base * share))
