"""Slot keys: their text, their instant, and the fast local-time formatting behind them."""

from __future__ import annotations

import random
from zoneinfo import available_timezones

import pytest

from engine.domain.slots import jitter_offset_ms, manual_slot_key, slot_instant, slot_key
from engine.domain.timeutil import iso_local, parse_instant, zone
from engine.domain.wallclock import format_local


def test_a_slot_key_is_the_schedule_id_and_the_local_time_with_offset() -> None:
    at = parse_instant("2026-10-25T00:30:00Z")
    assert slot_key("abc", at, "Europe/Berlin") == "abc@2026-10-25T02:30:00+02:00"


def test_the_two_passes_of_a_repeated_hour_have_different_keys() -> None:
    first = parse_instant("2026-10-25T02:30:00+02:00")
    second = parse_instant("2026-10-25T02:30:00+01:00")
    assert slot_key("abc", first, "Europe/Berlin") != slot_key("abc", second, "Europe/Berlin")


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata"])
def test_a_slot_key_spells_its_instant(tz: str) -> None:
    at = parse_instant("2026-03-29T01:30:00Z")
    assert slot_instant(slot_key("abc", at, tz)) == at


def test_a_manual_key_spells_its_instant_too() -> None:
    assert slot_instant(manual_slot_key("abc", 1_234_567, "n0nce")) == 1_234_567


@pytest.mark.parametrize("text", ["", "abc", "abc@", "abc@yesterday", "abc@2026-01-01T00:00:00"])
def test_text_that_is_not_a_slot_key_has_no_instant(text: str) -> None:
    assert slot_instant(text) is None


def test_fast_local_formatting_matches_isoformat_everywhere() -> None:
    zones = sorted(available_timezones())
    chooser = random.Random(42)
    for _ in range(20_000):
        tz = chooser.choice(zones)
        at = chooser.randrange(-2_000_000_000_000, 32_503_680_000_000)
        if chooser.random() < 0.5:
            at -= at % 1000
        assert format_local(at, zone(tz)) == iso_local(at, tz), (tz, at)


def test_jitter_offsets_are_stable_and_within_the_window() -> None:
    offsets = [jitter_offset_ms(f"abc@{n}", 30_000) for n in range(1000)]
    assert offsets == [jitter_offset_ms(f"abc@{n}", 30_000) for n in range(1000)]
    assert all(0 <= o <= 30_000 for o in offsets)
    assert len(set(offsets)) > 900
    assert jitter_offset_ms("abc@1", 0) == 0
