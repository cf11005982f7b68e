"""Mutation check: break one cron rule of the engine at runtime and show the property tests fail.

    python -m tests.oracle.mutate                    # the baseline, then every mutation
    python -m tests.oracle.mutate swap-first-last    # one mutation

Each run is a child process that monkeypatches the engine (no file is edited) and runs
tests/unit/test_cron_properties.py with pytest; the parent prints each run's summary and the
tests that failed. The baseline (no mutation) must pass and every mutation must fail; the exit
status is 0 exactly then. Not collected by pytest (its name is not test_*).

Mutations:
- swap-first-last: RepeatedHour.FIRST behaves as LAST and LAST as FIRST;
- drop-or-rule: the day fields always AND (Vixie's OR when both are restricted is gone);
- auto-is-first: AUTO fires the first pass only, even for a wildcard cron.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import date

TESTS = ["tests/unit/test_cron_properties.py"]


def _swap_first_last() -> None:
    from engine.domain.triggers import CronTrigger, RepeatedHour  # noqa: PLC0415

    original = CronTrigger.slot_after
    swap = {RepeatedHour.FIRST: RepeatedHour.LAST, RepeatedHour.LAST: RepeatedHour.FIRST}

    def slot_after(self: CronTrigger, after_ms: int, tz: str) -> object:
        if self.repeated in swap:
            self = dataclasses.replace(self, repeated=swap[self.repeated])
        return original(self, after_ms, tz)

    CronTrigger.slot_after = slot_after  # type: ignore[assignment,method-assign]


def _auto_is_first() -> None:
    from engine.domain.triggers import CronTrigger, RepeatedHour  # noqa: PLC0415

    original = CronTrigger.slot_after

    def slot_after(self: CronTrigger, after_ms: int, tz: str) -> object:
        if self.repeated is RepeatedHour.AUTO:
            self = dataclasses.replace(self, repeated=RepeatedHour.FIRST)
        return original(self, after_ms, tz)

    CronTrigger.slot_after = slot_after  # type: ignore[assignment,method-assign]


def _drop_or_rule() -> None:
    from engine.domain import cron  # noqa: PLC0415

    spec = cron.CronSpec
    for name in ("day_matches", "_dom_matches", "_dow_matches"):
        if not hasattr(spec, name):
            raise SystemExit(f"drop-or-rule: engine.domain.cron.CronSpec has no {name}")

    def day_matches(self: object, day: date) -> bool:
        return bool(self._dom_matches(day) and self._dow_matches(day))  # type: ignore[attr-defined]

    spec.day_matches = day_matches  # type: ignore[method-assign]


MUTATIONS: dict[str, Callable[[], None]] = {
    "swap-first-last": _swap_first_last,
    "drop-or-rule": _drop_or_rule,
    "auto-is-first": _auto_is_first,
}


def child(name: str) -> int:
    import pytest  # noqa: PLC0415

    if name != "baseline":
        MUTATIONS[name]()
    args = ["-q", "-p", "no:cacheprovider", "--tb=no", "-rf", "-W", "ignore", *TESTS]
    return int(pytest.main(args))


def run(name: str) -> bool:
    """Run one child; True when it did what it should (baseline passes, mutation fails)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.oracle.mutate", "--child", name],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.splitlines()
    failed = [line.split(" - ")[0] for line in lines if line.startswith("FAILED")]
    summary = next((line for line in reversed(lines) if re.search(r"passed|failed", line)), "")
    ok = (done.returncode == 0) if name == "baseline" else (done.returncode == 1 and bool(failed))
    verdict = "as expected" if ok else "UNEXPECTED"
    print(f"{name}: exit {done.returncode}, {summary.strip('= ')} ({verdict})")
    for line in failed:
        print(f"    {line.removeprefix('FAILED ')}")
    if done.returncode not in (0, 1):
        print(done.stdout[-3000:], done.stderr[-3000:])
    return ok


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        return child(argv[1])
    names = argv or ["baseline", *MUTATIONS]
    unknown = [n for n in names if n != "baseline" and n not in MUTATIONS]
    if unknown:
        print(f"unknown mutation {unknown}; known: {', '.join(MUTATIONS)}")
        return 2
    results = [run(name) for name in names]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
