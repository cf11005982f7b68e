"""The cyclic collector held off for dispatch transactions: on during none, off during each,
and left as found (someone else's `gc.disable()` is not undone)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from engine.runtime.daemon import _CyclicGcHold


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_off_while_held_and_on_again_after() -> None:
    gc.enable()
    hold = _CyclicGcHold()
    with hold.held():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_two_holders_on_two_threads_turn_it_on_only_when_both_are_done() -> None:
    gc.enable()
    hold = _CyclicGcHold()
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with hold.held():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    assert entered.wait(10)
    with hold.held():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other transaction is still under way
    release.set()
    thread.join(10)
    assert gc.isenabled()


def test_a_collector_turned_off_by_someone_else_stays_off() -> None:
    gc.disable()
    hold = _CyclicGcHold()
    with hold.held():
        assert not gc.isenabled()
    assert not gc.isenabled()
