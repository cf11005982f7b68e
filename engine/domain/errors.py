"""The engine's errors. Each carries the process exit code the CLI maps it to.

Messages say what is wrong and what to do about it; they are shown to operators as they are.
"""

from __future__ import annotations


class VortosError(Exception):
    """Base of every error the engine raises on purpose."""

    exit_code = 1


class InvalidInput(VortosError):
    """A user-supplied value (cron, zone, name, payload, duration, ...) is not acceptable."""

    exit_code = 2


class NotFound(VortosError):
    """The named schedule, run or database does not exist."""

    exit_code = 3


class Conflict(VortosError):
    """The change clashes with what is stored (a taken name, a stale version)."""

    exit_code = 5


class DuplicateName(Conflict):
    """A schedule with this name already exists in the tenant."""


class StaleVersion(Conflict):
    """The schedule changed since it was read (optimistic lock)."""


class DuplicateSlot(Conflict):
    """The slot was already dispatched: the run ledger holds its key."""

    def __init__(self, slot_key: str) -> None:
        super().__init__(f"slot {slot_key} was already dispatched")
        self.slot_key = slot_key


class StorageError(VortosError):
    """The database cannot be used as asked (missing, corrupt, foreign, newer, read-only)."""


class DatabaseUnreadable(StorageError):
    """The database file itself failed: not a database, corrupt, an I/O error, or it cannot be
    opened; not a lock held by someone else. A service retries it a few times (it can be
    momentary), then stops rather than serve a file it cannot read."""


class DatabaseUnavailable(StorageError):
    """The database server could not be reached, or the connection to it was lost (a restart,
    a terminated session, a network cut): nothing is wrong with the database or the URL as far
    as is known, and trying again later may succeed. A service retries it with backoff."""


class LeaseError(VortosError):
    """Base of lease failures."""


class LeaseNotOwned(LeaseError):
    """The caller's token does not hold the lease (never did, or someone else took it)."""


class LeaseExpired(LeaseError):
    """The caller held the lease but let it expire; it must acquire again."""


class AuditKeyMissing(VortosError):
    """No audit key where one must be: changes are refused rather than left unaudited."""

    exit_code = 1


class AuditKeyMismatch(AuditKeyMissing):
    """This process's audit key is not the one the database signs with (another deployment's
    key, a host that made its own, or a key rotated elsewhere): it must not sign, and the
    message names both fingerprints and what to do."""

    exit_code = 2
