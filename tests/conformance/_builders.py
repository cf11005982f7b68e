"""The shipped suites' builders, for the tests that still import them from here."""

from __future__ import annotations

from engine.testing.conformance.builders import (
    CREATED_AT,
    FIRST_SLOT,
    make_run,
    make_schedule,
    stored_schedule,
)

__all__ = ["CREATED_AT", "FIRST_SLOT", "make_run", "make_schedule", "stored_schedule"]
