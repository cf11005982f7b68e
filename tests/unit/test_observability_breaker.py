"""The circuit breaker's states on a manual clock."""

from __future__ import annotations

import pytest

from engine import ManualClock
from engine.runtime.breaker import BreakerState, CircuitBreaker
from tests.conftest import T0


@pytest.fixture
def changes() -> list[BreakerState]:
    return []


@pytest.fixture
def breaker(clock: ManualClock, changes: list[BreakerState]) -> CircuitBreaker:
    return CircuitBreaker(clock, failures=3, recovery_ms=30_000, on_change=changes.append)


def fail(breaker: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        assert breaker.allow()
        breaker.failed()


def test_it_stays_closed_below_the_threshold(breaker: CircuitBreaker) -> None:
    fail(breaker, 2)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allow()


def test_a_success_resets_the_count_of_consecutive_failures(breaker: CircuitBreaker) -> None:
    fail(breaker, 2)
    breaker.succeeded()
    fail(breaker, 2)
    assert breaker.state is BreakerState.CLOSED


def test_it_opens_after_n_consecutive_failures_and_refuses_calls(
    breaker: CircuitBreaker, changes: list[BreakerState]
) -> None:
    fail(breaker, 3)
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()
    assert breaker.retry_at_ms == T0 + 30_000
    assert changes == [BreakerState.OPEN]


def test_it_half_opens_for_one_probe_after_the_recovery_window(
    breaker: CircuitBreaker, clock: ManualClock, changes: list[BreakerState]
) -> None:
    fail(breaker, 3)
    clock.advance(29.999)
    assert not breaker.allow()
    clock.advance(0.001)
    assert breaker.allow()
    assert breaker.state is BreakerState.HALF_OPEN
    assert changes == [BreakerState.OPEN, BreakerState.HALF_OPEN]


def test_a_successful_probe_closes_it(
    breaker: CircuitBreaker, clock: ManualClock, changes: list[BreakerState]
) -> None:
    fail(breaker, 3)
    clock.advance(30)
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.consecutive_failures == 0
    assert breaker.retry_at_ms is None
    assert changes[-1] is BreakerState.CLOSED


def test_a_failed_probe_opens_it_for_another_window(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    fail(breaker, 3)
    clock.advance(30)
    fail(breaker, 1)
    assert breaker.state is BreakerState.OPEN
    assert breaker.retry_at_ms == clock.now_ms() + 30_000
    assert not breaker.allow()


def test_nonsense_settings_are_refused(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="failures"):
        CircuitBreaker(clock, failures=0)
    with pytest.raises(ValueError, match="at least 1s"):
        CircuitBreaker(clock, recovery_ms=10)
