"""The cardinality guard: the first N distinct values keep their own label."""

from __future__ import annotations

from engine.observability import CardinalityGuard


def test_the_first_n_distinct_keys_are_admitted_and_stay_admitted() -> None:
    refused: list[int] = []
    guard = CardinalityGuard(2, on_overflow=lambda: refused.append(1))
    assert guard.admit(("t", "a"))
    assert guard.admit(("t", "b"))
    assert not guard.admit(("t", "c"))
    assert guard.admit(("t", "a"))  # admitted once, admitted for good
    assert not guard.admit(("t", "c"))
    assert len(guard) == 2
    assert len(refused) == 2  # each refused observation is counted


def test_a_zero_cap_admits_nothing() -> None:
    guard = CardinalityGuard(0)
    assert not guard.admit("a")
