"""CircuitBreaker: stop hammering a store that keeps failing, then probe it.

The daemon wraps its dispatch transaction in one. While it is open no dispatch is attempted, so
nothing is written and no cursor moves: the slots that fall due meanwhile stay due, and once the
breaker closes they are dispatched as each schedule's misfire policy says, exactly once, like
after any outage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import StrEnum

from engine.domain.clock import Clock

DEFAULT_BREAKER_FAILURES = 5
DEFAULT_BREAKER_RECOVERY_MS = 30_000
MIN_BREAKER_RECOVERY_MS = 1_000
MAX_BREAKER_FAILURES = 1_000


class BreakerState(StrEnum):
    CLOSED = "closed"  # calls go through
    OPEN = "open"  # no call until the recovery window has passed
    HALF_OPEN = "half_open"  # one call goes through, as a probe


BreakerListener = Callable[[BreakerState], None]


class CircuitBreaker:
    """Closed: every call goes through, and `failures` consecutive failures open the breaker.
    Open: `allow()` says no for `recovery_ms` of the clock; then the breaker half-opens and lets
    one call through as a probe. The probe's success closes it; its failure opens it again for
    another window.

    The caller reports each call's outcome with `succeeded()` or `failed()`. Driven from one
    thread (the daemon's); `state` may be read from any (a console, a metrics scrape).
    `on_change` is told each new state, outside the breaker's lock.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        failures: int = DEFAULT_BREAKER_FAILURES,
        recovery_ms: int = DEFAULT_BREAKER_RECOVERY_MS,
        on_change: BreakerListener | None = None,
    ) -> None:
        if not 1 <= failures <= MAX_BREAKER_FAILURES:
            raise ValueError(f"the breaker opens after 1 to {MAX_BREAKER_FAILURES} failures")
        if recovery_ms < MIN_BREAKER_RECOVERY_MS:
            raise ValueError("the breaker's recovery window must be at least 1s")
        self._clock = clock
        self.failure_threshold = failures
        self.recovery_ms = recovery_ms
        self._on_change = on_change
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at: int | None = None

    @property
    def state(self) -> BreakerState:
        """Open until a call is allowed through as the probe (see `allow`)."""
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def retry_at_ms(self) -> int | None:
        """While open: the instant the probe will be allowed. None otherwise."""
        opened = self._opened_at
        if self._state is not BreakerState.OPEN or opened is None:
            return None
        return opened + self.recovery_ms

    def allow(self) -> bool:
        """May a call go through now? Half-opens the breaker once the window has passed."""
        if self._state is BreakerState.CLOSED:
            return True
        with self._lock:
            if self._state is not BreakerState.OPEN:
                return True  # closed meanwhile, or half-open: the probe goes through
            assert self._opened_at is not None
            if self._clock.now_ms() < self._opened_at + self.recovery_ms:
                return False
            self._state = BreakerState.HALF_OPEN
        self._changed(BreakerState.HALF_OPEN)
        return True

    def succeeded(self) -> None:
        if self._state is BreakerState.CLOSED and not self._failures:
            return  # the hot path: nothing to change, no lock taken
        with self._lock:
            self._failures = 0
            self._opened_at = None
            if self._state is BreakerState.CLOSED:
                return
            self._state = BreakerState.CLOSED
        self._changed(BreakerState.CLOSED)

    def failed(self) -> None:
        with self._lock:
            self._failures += 1
            opening = self._state is BreakerState.HALF_OPEN or (
                self._state is BreakerState.CLOSED and self._failures >= self.failure_threshold
            )
            if self._state is BreakerState.OPEN:
                return  # a call that was let through before the breaker opened
            if not opening:
                return
            self._state = BreakerState.OPEN
            self._opened_at = self._clock.now_ms()
        self._changed(BreakerState.OPEN)

    def _changed(self, state: BreakerState) -> None:
        if self._on_change is not None:
            self._on_change(state)
