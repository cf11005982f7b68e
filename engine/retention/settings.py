"""The sweeper's settings: how long history is kept by default, and how a sweep paces itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.domain.errors import InvalidInput

DEFAULT_DAYS = 30
DEFAULT_DEAD_LETTER_DAYS = 90
DEFAULT_BATCH_SIZE = 5000
DEFAULT_BUDGET_S = 240
MAX_DAYS = 36_500  # a century: longer is a typo (0 keeps history forever)
MAX_BATCH_SIZE = 100_000
MAX_BUDGET_S = 86_400


def validate_days(days: int, *, what: str = "retention") -> int:
    """0 (keep forever) or a number of days up to MAX_DAYS."""
    if isinstance(days, bool) or not isinstance(days, int):
        raise InvalidInput(f"{what} must be a whole number of days, not {days!r}")
    if days < 0:
        raise InvalidInput(
            f"{what} of {days} days is negative: give 0 (keep forever) or a number of days "
            f"up to {MAX_DAYS}"
        )
    if days > MAX_DAYS:
        raise InvalidInput(
            f"{what} of {days} days is more than {MAX_DAYS} (a century): to keep history "
            "forever, give 0"
        )
    return days


def _bounded(value: Any, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{what} {value!r} is out of range: use {low} to {high}")
    return value


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    """What every tenant without an override gets, and the limits of one sweep.

    - `days`: terminal runs are kept this long after they finished (0: forever).
    - `dead_letter_days`: dead letters, and their runs, are kept this long after they were
      dead-lettered, and never less than the tenant's own retention (0: forever).
    - `batch_size`: runs deleted per write transaction, at most.
    - `budget_s`: a sweep stops after this long (reporting `truncated`); the next one goes
      on. The first batch always runs, so a sweep always makes progress.
    - `audit_archive_dir`: when set, each sweep then archives the audit entries older than
      `audit_archive_days` into this directory and prunes them (engine.governance.archive);
      None (the default): the audit chain is kept whole in the database.
    - `audit_archive_days`: the age past which audit entries are archived (None: `days`; 0
      with `days` 0: never).
    """

    days: int = DEFAULT_DAYS
    dead_letter_days: int = DEFAULT_DEAD_LETTER_DAYS
    batch_size: int = DEFAULT_BATCH_SIZE
    budget_s: int = DEFAULT_BUDGET_S
    audit_archive_dir: str | None = None
    audit_archive_days: int | None = None

    def __post_init__(self) -> None:
        validate_days(self.days)
        validate_days(self.dead_letter_days, what="dead-letter retention")
        _bounded(self.batch_size, 1, MAX_BATCH_SIZE, "batch size")
        _bounded(self.budget_s, 0, MAX_BUDGET_S, "time budget (seconds)")
        if self.audit_archive_dir is not None and (
            not isinstance(self.audit_archive_dir, str) or not self.audit_archive_dir.strip()
        ):
            raise InvalidInput(
                f"audit_archive_dir {self.audit_archive_dir!r} must be a directory path (or "
                "left out: no archiving)"
            )
        if self.audit_archive_days is not None:
            validate_days(self.audit_archive_days, what="audit archive age")

    @property
    def archive_days(self) -> int:
        """Audit entries older than this many days are archived (0: never)."""
        return self.days if self.audit_archive_days is None else self.audit_archive_days

    def to_payload(self) -> dict[str, Any]:
        """The sweeper schedule's payload (the command's keyword arguments); the archive's
        settings only when set, so a sweeper without them keeps the payload it always had."""
        payload: dict[str, Any] = {
            "days": self.days,
            "dead_letter_days": self.dead_letter_days,
            "batch_size": self.batch_size,
            "budget_s": self.budget_s,
        }
        if self.audit_archive_dir is not None:
            payload["audit_archive_dir"] = self.audit_archive_dir
        if self.audit_archive_days is not None:
            payload["audit_archive_days"] = self.audit_archive_days
        return payload

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> RetentionSettings:
        """Settings from a payload (missing fields take their defaults). Raises InvalidInput."""
        default = cls()
        known = {*default.to_payload(), "audit_archive_dir", "audit_archive_days"}
        unknown = sorted(set(payload) - known)
        if unknown:
            raise InvalidInput(f"unknown retention setting(s): {', '.join(unknown)}")
        return cls(**{**default.to_payload(), **payload})
