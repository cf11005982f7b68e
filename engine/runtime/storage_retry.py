"""How a service loop (the daemon's, the consumer's) meets a storage error.

Any storage error is logged and the loop tries again after a backoff: a lock held past the busy
timeout, a database restarting or a lost connection (DatabaseUnavailable, logged as such), a
file that reads wrong for a moment (another process touching it). Nothing is lost meanwhile: a
failed transaction writes nothing, and a claimed fire whose settlement cannot be written is
claimed again when its claim expires.

Only a file that stays unreadable (DatabaseUnreadable: not a database, corrupt, an I/O error,
cannot be opened) try after try ends the loop, after UNREADABLE_TRIES in a row, with one line
saying so: a service manager then restarts the service, and the operator sees why.
"""

from __future__ import annotations

import logging
import time

from engine.domain.errors import DatabaseUnavailable, DatabaseUnreadable, StorageError
from engine.domain.timeutil import format_duration

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
# 0.5 + 1 + 2 + 4 + 8 s of backoff: the file stayed unreadable for about 15s.
UNREADABLE_TRIES = 6


class StorageRetry:
    """The consecutive storage failures of one loop: `failed` says how long to back off, or
    raises when the file has stayed unreadable too long; `succeeded` starts over."""

    def __init__(self, log: logging.Logger, *, unreadable_tries: int = UNREADABLE_TRIES) -> None:
        self._log = log
        self._unreadable_tries = unreadable_tries
        self._failures = 0
        self._unreadable = 0
        self._since = 0.0

    def succeeded(self) -> None:
        self._failures = 0
        self._unreadable = 0

    def failed(self, error: StorageError) -> float:
        """Log `error`; return the seconds to wait before trying again. Raises
        DatabaseUnreadable when the file was unreadable this many tries in a row."""
        if self._failures == 0:
            self._since = time.monotonic()  # real time: only for the message
        self._failures += 1
        if isinstance(error, DatabaseUnreadable):
            self._unreadable += 1
            if self._unreadable >= self._unreadable_tries:
                took = format_duration(round(time.monotonic() - self._since) * 1000)
                raise DatabaseUnreadable(
                    f"{error} (failed {self._unreadable} times in a row over {took}: stopping)"
                ) from None
        else:
            self._unreadable = 0
        backoff = min(FIRST_BACKOFF_S * 2.0 ** min(self._failures - 1, 16), MAX_BACKOFF_S)
        if isinstance(error, DatabaseUnavailable):
            # Said as what it is (a lost connection, a server restarting), not as a fault.
            self._log.warning("%s; retrying in %.1f s", error, backoff)
        else:
            self._log.error("storage error: %s (retrying in %.1fs)", error, backoff)
        return backoff
