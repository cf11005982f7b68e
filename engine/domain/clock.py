"""Time for the engine. Nothing in the engine reads the wall clock except through a `Clock`."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """A source of the current instant, and a way to wait that the same clock governs.

    Instants are integer milliseconds since the Unix epoch, UTC.
    """

    def now_ms(self) -> int:
        """The current instant."""
        ...

    def wait(self, wake: threading.Event, seconds: float) -> bool:
        """Block until `wake` is set or `seconds` of this clock's time have passed.

        Returns True when woken by the event.
        """
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def wait(self, wake: threading.Event, seconds: float) -> bool:
        return wake.wait(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when told to: tests simulate days in milliseconds."""

    def __init__(self, start_ms: int) -> None:
        self._now = start_ms
        self._moved = threading.Condition()

    def now_ms(self) -> int:
        with self._moved:
            return self._now

    def set(self, instant_ms: int) -> None:
        with self._moved:
            if instant_ms < self._now:
                raise ValueError("a manual clock never goes backwards")
            self._now = instant_ms
            self._moved.notify_all()

    def advance(self, seconds: float) -> None:
        self.set(self.now_ms() + round(seconds * 1000))

    def wait(self, wake: threading.Event, seconds: float) -> bool:
        deadline = self.now_ms() + round(max(0.0, seconds) * 1000)
        with self._moved:
            while not wake.is_set() and self._now < deadline:
                # The event is set from other threads without our condition: look again
                # often enough that a stop request is seen promptly.
                self._moved.wait(0.01)
        return wake.is_set()
