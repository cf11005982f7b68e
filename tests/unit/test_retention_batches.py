"""The retention sweep's batch size follows how long its write transactions take."""

from __future__ import annotations

from engine.retention.sweeper import MIN_BATCH, TARGET_WRITE_S, _next_size


def test_a_slow_batch_halves_the_next_down_to_the_floor() -> None:
    assert _next_size(4000, TARGET_WRITE_S * 2, 5000) == 2000
    assert _next_size(MIN_BATCH, TARGET_WRITE_S * 10, 5000) == MIN_BATCH


def test_a_quick_batch_doubles_the_next_up_to_the_configured_size() -> None:
    assert _next_size(1000, TARGET_WRITE_S / 10, 5000) == 2000
    assert _next_size(4000, TARGET_WRITE_S / 10, 5000) == 5000


def test_a_batch_near_the_target_keeps_its_size() -> None:
    assert _next_size(3000, TARGET_WRITE_S / 2, 5000) == 3000


def test_a_configured_size_under_the_floor_is_kept() -> None:
    assert _next_size(100, TARGET_WRITE_S * 3, 100) == 100
