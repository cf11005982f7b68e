"""Next fire for cron: Vortos beside croniter and cronsim, in one run.

1. Random crons: 1,000 random 5-field expressions (`--quick`: 100) from a fixed seed, made of
   lists, ranges, steps (`*/S`, `N-M/S`, `N/S`), month and weekday names, `?`, `L`, `LW`,
   `NW`, `D#k`, `DL` and `LD`. For each, the next 50 fires (`--quick`: 20) after one fixed
   instant, in UTC and in Europe/Berlin: Vortos `CronTrigger(expr).slot_after(after_ms, tz)`
   chained from one slot to the next, croniter `croniter(expr, start).get_next()` and cronsim
   `next(CronSim(expr, start))`, `start` the instant as an aware datetime in the zone. Only the
   next-fire calls are timed (µs per next); building the iterator or parsing is a row of its
   own (Vortos: `parse_cron`, its cache bypassed; the others: their constructor). An
   expression a library refuses (at construction or at its first next) is counted and skipped
   for that library only. The fires are compared: how many expressions give the same fires
   as Vortos.
2. Transition days: from 1 hour before a DST transition to 2 hours after it (spring and autumn,
   Europe/Berlin and Australia/Lord_Howe, whose clock moves 30 minutes), every fire of an hourly,
   an every-minute and an every-10-seconds cron (6 fields, seconds first: Vortos and cronsim
   only; croniter puts the seconds last), restarted from the start until enough calls were
   timed; beside Vortos on the same hours a week before, to show next-fire stays flat on
   transition days.

Vortos runs with its default DST rules (printed). Several rounds, rotating which library goes
first; medians. `--profile` adds cProfile (top 15 by own time) of Vortos on the slowest case.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import math
import pstats
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter
from cronsim import CronSim

from bench._common import cores, machine_busy_s, num, print_table
from engine.domain.cron import parse_cron
from engine.domain.triggers import CronTrigger

LIBRARIES = ("Vortos", "croniter", "cronsim")
SEED = 20250330
# The random crons' fires start after this instant (an ordinary winter day, not on a boundary).
START = datetime(2025, 1, 15, 10, 17, 23, tzinfo=UTC)
ZONES = ("UTC", "Europe/Berlin")
TRANSITION_ZONES = ("Europe/Berlin", "Australia/Lord_Howe")
TRANSITION_CRONS = (
    ("hourly", "0 * * * *", True),
    ("every minute", "* * * * *", True),
    ("every 10 s", "*/10 * * * * *", False),  # seconds first: croniter has them last
)
HOUR_MS = 3_600_000

# -- random expressions ----------------------------------------------------------------------

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _name(rng: random.Random, text: str) -> str:
    return rng.choice((text, text.upper(), text.capitalize()))


def _numeric(rng: random.Random, low: int, high: int) -> str:
    """A minute or hour field (or a plain day-of-month one with `high` 28)."""

    def item() -> str:
        kind = rng.choices(("n", "range", "range/s", "n/s"), (4, 2, 1, 1))[0]
        a = rng.randint(low, high)
        b = rng.randint(a, high)
        if kind == "n":
            return str(a)
        if kind == "range":
            return f"{a}-{b}"
        if kind == "range/s":
            return f"{a}-{b}/{rng.randint(1, max(1, (b - a) // 2 + 1))}"
        return f"{a}/{rng.randint(2, max(2, (high - low) // 3))}"

    kind = rng.choices(("*", "*/s", "item", "list"), (3, 2, 3, 2))[0]
    if kind == "*":
        return "*"
    if kind == "*/s":
        return f"*/{rng.randint(2, max(2, (high - low + 1) // 2))}"
    if kind == "item":
        return item()
    return ",".join(item() for _ in range(rng.randint(2, 4)))


def _month(rng: random.Random) -> str:
    def one() -> str:
        m = rng.randint(1, 12)
        return _name(rng, MONTHS[m - 1]) if rng.random() < 0.5 else str(m)

    kind = rng.choices(("*", "one", "list", "range", "*/s", "range/s"), (8, 2, 2, 1, 1, 1))[0]
    if kind == "*":
        return "*"
    if kind == "one":
        return one()
    if kind == "list":
        return ",".join(one() for _ in range(rng.randint(2, 4)))
    a = rng.randint(1, 11)
    b = rng.randint(a + 1, 12)
    span = (
        f"{_name(rng, MONTHS[a - 1])}-{_name(rng, MONTHS[b - 1])}"
        if rng.random() < 0.5
        else f"{a}-{b}"
    )
    if kind == "range":
        return span
    if kind == "*/s":
        return f"*/{rng.randint(2, 6)}"
    return f"{span}/{rng.randint(2, 3)}"


def _dom(rng: random.Random, any_month: bool) -> str:
    """Day of month; numbers above 28 only when every month is allowed (no never-firing crons)."""
    top = 31 if any_month else 28
    kind = rng.choices(("*", "?", "numeric", "L", "LW", "NW", "mixed"), (10, 1, 5, 1, 1, 1, 1))[0]
    if kind in ("*", "?", "L", "LW"):
        return kind
    if kind == "NW":
        return f"{rng.randint(1, 28)}W"
    if kind == "mixed":
        return ",".join(
            rng.choice(
                ("L", str(rng.randint(1, top)), f"{rng.randint(1, 14)}-{rng.randint(15, 28)}")
            )
            for _ in range(rng.randint(2, 3))
        )
    return _numeric(rng, 1, top)


def _dow(rng: random.Random, any_month: bool, dom_starred_step: bool) -> str:
    """Day of week. `D#5` only when every month is allowed; with a `*/S` day of month (ANDed
    with it) only plain weekdays, so that no cron is left that never fires."""

    def one() -> str:
        d = rng.randint(0, 7)
        return _name(rng, DAYS[d % 7]) if rng.random() < 0.4 else str(d)

    plain = ("*", "one", "list", "range", "*/s")
    extra = ("#", "DL", "LD", "mixed")
    kinds, weights = (
        (plain, (10, 2, 2, 2, 1))
        if dom_starred_step
        else (
            plain + extra,
            (10, 2, 2, 2, 1, 1, 1, 1, 1),
        )
    )
    kind = rng.choices(kinds, weights)[0]
    if kind == "*":
        return "*"
    if kind == "one":
        return one()
    if kind == "list":
        return ",".join(one() for _ in range(rng.randint(2, 4)))
    if kind == "range":
        a = rng.randint(0, 5)
        b = rng.randint(a + 1, 6)
        if rng.random() < 0.5:
            return f"{_name(rng, DAYS[a])}-{_name(rng, DAYS[b])}"
        return f"{a}-{b}"
    if kind == "*/s":
        return f"*/{rng.randint(2, 3)}"
    nth = rng.randint(1, 5 if any_month else 4)
    if kind == "#":
        return f"{rng.randint(0, 6)}#{nth}"
    if kind == "DL":
        return f"{rng.randint(0, 6)}L"
    if kind == "LD":
        return f"L{rng.randint(0, 6)}"
    return ",".join((f"{rng.randint(0, 6)}#{nth}", one()))


def random_expressions(count: int, seed: int = SEED) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        month = _month(rng)
        dom = _dom(rng, month == "*")
        dow = _dow(rng, month == "*", dom.startswith("*/"))
        out.append(" ".join((_numeric(rng, 0, 59), _numeric(rng, 0, 23), dom, month, dow)))
    return out


# -- one library's next-fire loop ------------------------------------------------------------
#
# Each runner makes `count` next calls at most, stopping at the first fire at or after
# `until_ms`, and returns the fires as epoch ms (converted after the timed loop) and the
# seconds the next calls took. A library's error during its next calls ends that expression.


@dataclass(slots=True)
class Run:
    fires: list[int]
    seconds: float
    calls: int
    error: str | None = None  # the exception that ended the run early


def vortos_prepare(expr: str, start: datetime) -> Any:
    return CronTrigger(expr)


def vortos_run(trigger: Any, start: datetime, tz: str, count: int, until_ms: int) -> Run:
    slot_after = trigger.slot_after
    after = int(start.timestamp() * 1000)
    fires: list[int] = []
    calls = 0
    t0 = time.perf_counter()
    for _ in range(count):
        calls += 1
        slot = slot_after(after, tz)
        if slot is None:
            break
        after = slot.at_ms
        if after >= until_ms:
            break
        fires.append(after)
    return Run(fires, time.perf_counter() - t0, calls)


def croniter_prepare(expr: str, start: datetime) -> Any:
    return croniter(expr, start)


def croniter_run(it: Any, start: datetime, tz: str, count: int, until_ms: int) -> Run:
    get_next = it.get_next
    until_s = until_ms / 1000
    raw: list[float] = []
    calls = 0
    error = None
    t0 = time.perf_counter()
    try:
        for _ in range(count):
            calls += 1
            value = get_next()
            if value >= until_s:
                break
            raw.append(value)
    except Exception as exc:  # croniter gives up (CroniterBadDateError ...): the run ends
        error = type(exc).__name__
    seconds = time.perf_counter() - t0
    return Run([round(v * 1000) for v in raw], seconds, calls, error)


def cronsim_prepare(expr: str, start: datetime) -> Any:
    return CronSim(expr, start)


def cronsim_run(it: Any, start: datetime, tz: str, count: int, until_ms: int) -> Run:
    until = datetime.fromtimestamp(until_ms / 1000, UTC)
    raw: list[datetime] = []
    calls = 0
    error = None
    t0 = time.perf_counter()
    try:
        for value in itertools.islice(it, count):
            calls += 1
            if value >= until:
                break
            raw.append(value)
    except Exception as exc:
        error = type(exc).__name__
    seconds = time.perf_counter() - t0
    return Run([round(v.timestamp() * 1000) for v in raw], seconds, calls, error)


Prepare = Callable[[str, datetime], Any]
Runner = Callable[[Any, datetime, str, int, int], Run]
PREPARE: dict[str, Prepare] = {
    "Vortos": vortos_prepare,
    "croniter": croniter_prepare,
    "cronsim": cronsim_prepare,
}
RUN: dict[str, Runner] = {"Vortos": vortos_run, "croniter": croniter_run, "cronsim": cronsim_run}
# Vortos's parse, without the cache in front of it (if there is one): a parse, not a look-up.
_parse_uncached = getattr(parse_cron, "__wrapped__", parse_cron)
PARSE: dict[str, Callable[[str, datetime], object]] = {
    "Vortos": lambda expr, start: _parse_uncached(expr),
    "croniter": croniter_prepare,
    "cronsim": cronsim_prepare,
}
NEVER = int(datetime(9000, 1, 1, tzinfo=UTC).timestamp() * 1000)  # no `until`: the count alone


# -- 1. random crons -------------------------------------------------------------------------


@dataclass(slots=True)
class ZoneResult:
    """One library in one zone over all rounds."""

    refused: set[str] = field(default_factory=set)
    per_next_us: list[float] = field(default_factory=list)  # one per round
    parse_us: list[float] = field(default_factory=list)  # one per round
    fires: dict[str, list[int]] = field(default_factory=dict)  # from the first round
    per_expr_us: dict[str, float] = field(default_factory=dict)  # best round, per next
    short: int = 0  # expressions that gave fewer fires than asked
    errored: int = 0  # ... of them, ended by the library's error


def run_random(
    expressions: Sequence[str], zone: str, fires: int, rounds: int
) -> dict[str, ZoneResult]:
    start = START.astimezone(ZoneInfo(zone))
    results = {lib: ZoneResult() for lib in LIBRARIES}
    for round_no in range(rounds):
        order = LIBRARIES[round_no % 3 :] + LIBRARIES[: round_no % 3]
        for lib in order:
            res = results[lib]
            prepare, runner, parse = PREPARE[lib], RUN[lib], PARSE[lib]
            total_s = 0.0
            calls = 0
            parse_s = 0.0
            parsed = 0
            for expr in expressions:
                if expr in res.refused:
                    continue
                t0 = time.perf_counter()
                try:
                    parse(expr, start)
                except Exception:
                    res.refused.add(expr)
                    continue
                parse_s += time.perf_counter() - t0
                parsed += 1
                it = prepare(expr, start)
                run = runner(it, start, zone, fires, NEVER)
                if not run.fires and round_no == 0:
                    res.refused.add(expr)  # refused at its first next
                    continue
                total_s += run.seconds
                calls += run.calls
                us = 1e6 * run.seconds / max(1, run.calls)
                res.per_expr_us[expr] = min(us, res.per_expr_us.get(expr, us))
                if round_no == 0:
                    res.fires[expr] = run.fires
                    res.short += len(run.fires) < fires
                    res.errored += run.error is not None
            res.per_next_us.append(1e6 * total_s / max(1, calls))
            res.parse_us.append(1e6 * parse_s / max(1, parsed))
    return results


def _local(ms: int, zone: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).isoformat()


def differences(
    results: dict[str, ZoneResult], zone: str, other: str, limit: int = 3
) -> tuple[int, int, list[str]]:
    """How many expressions both accept, how many give the same fires, and a few that do not."""
    mine, theirs = results["Vortos"].fires, results[other].fires
    both = [e for e in mine if e in theirs]
    same = sum(mine[e] == theirs[e] for e in both)
    examples: list[str] = []
    for expr in both:
        a, b = mine[expr], theirs[expr]
        if a == b or len(examples) >= limit:
            continue
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if i is None:
            examples.append(f"  {expr!r}: Vortos {len(a)} fires, {other} {len(b)}")
        else:
            examples.append(
                f"  {expr!r}: fire {i + 1}: Vortos {_local(a[i], zone)}, "
                f"{other} {_local(b[i], zone)}"
            )
    return len(both), same, examples


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if not math.isnan(theirs) and theirs > 0 else "-"


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- 2. transition days ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Transition:
    zone: str
    at_ms: int
    gap: bool  # spring: the clock jumps forward

    @property
    def label(self) -> str:
        return f"{self.zone} {'spring' if self.gap else 'autumn'}"


def transitions(zone: str, year: int) -> list[Transition]:
    """The zone's offset changes in `year`, found by zoneinfo alone (hour steps, then bisection)."""
    local = ZoneInfo(zone)

    def offset(ms: int) -> timedelta | None:
        return datetime.fromtimestamp(ms / 1000, local).utcoffset()

    out = []
    t = int(datetime(year, 1, 1, tzinfo=UTC).timestamp() * 1000)
    end = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp() * 1000)
    while t < end:
        before, after = offset(t), offset(t + HOUR_MS)
        if before != after:
            lo, hi = t, t + HOUR_MS
            while hi - lo > 1000:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(mid) == before else (lo, mid)
            assert before is not None
            assert after is not None
            out.append(Transition(zone, hi, after > before))
        t += HOUR_MS
    return out


@dataclass(slots=True)
class WindowTiming:
    per_next_us: float
    fires: int  # fires in one pass over the window


def time_window(
    lib: str, expr: str, zone: str, start_ms: int, end_ms: int, calls_wanted: int
) -> WindowTiming:
    """Every fire in (start, end), restarted from `start` until `calls_wanted` calls were timed."""
    start = datetime.fromtimestamp(start_ms / 1000, ZoneInfo(zone))
    prepare, runner = PREPARE[lib], RUN[lib]
    total_s = 0.0
    calls = 0
    fires = 0
    while calls < calls_wanted:
        run = runner(prepare(expr, start), start, zone, 10**9, end_ms)
        total_s += run.seconds
        calls += run.calls
        fires = len(run.fires)
    return WindowTiming(1e6 * total_s / calls, fires)


@dataclass(slots=True)
class TransitionRow:
    label: str
    expr: str
    zone: str
    start_ms: int
    end_ms: int
    timings: dict[str, list[WindowTiming]]  # per library (and "week before"), one per round


def run_transitions(calls_wanted: int, rounds: int, year: int = 2025) -> list[TransitionRow]:
    rows = []
    for zone in TRANSITION_ZONES:
        found = sorted(transitions(zone, year), key=lambda t: not t.gap)  # spring first
        for tr in found:
            for what, expr, croniter_too in TRANSITION_CRONS:
                libs = [lib for lib in LIBRARIES if croniter_too or lib != "croniter"]
                start, end = tr.at_ms - HOUR_MS, tr.at_ms + 2 * HOUR_MS
                row = TransitionRow(f"{tr.label}, {what}", expr, zone, start, end, {})
                week = 7 * 24 * HOUR_MS
                for round_no in range(rounds):
                    order = libs[round_no % len(libs) :] + libs[: round_no % len(libs)]
                    for lib in order:
                        timing = time_window(lib, expr, zone, start, end, calls_wanted)
                        row.timings.setdefault(lib, []).append(timing)
                    before = time_window(
                        "Vortos", expr, zone, start - week, end - week, calls_wanted
                    )
                    row.timings.setdefault("week before", []).append(before)
                rows.append(row)
    return rows


# -- profile ---------------------------------------------------------------------------------


def profile_text(profiler: cProfile.Profile, lines: int) -> str:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def _row(label: str, us: dict[str, float]) -> list[object]:
    nan = float("nan")
    return [
        label,
        num(us["Vortos"], 2),
        num(us.get("croniter", nan), 2),
        num(us["cronsim"], 2),
        ratio(us["Vortos"], us.get("croniter", nan)),
        ratio(us["Vortos"], us["cronsim"]),
    ]


@dataclass(frozen=True, slots=True)
class Case:
    """A row of the main table, and how to run Vortos on it again (for the profile)."""

    label: str
    vortos_us: float
    again: Callable[[], object]


def print_next_table(
    expressions: Sequence[str],
    by_zone: dict[str, dict[str, ZoneResult]],
    transition_rows: Sequence[TransitionRow],
    fires: int,
    rounds: int,
) -> list[Case]:
    table = []
    cases = []
    for zone, results in by_zone.items():
        us = {lib: med(results[lib].per_next_us) for lib in LIBRARIES}
        parse = {lib: med(results[lib].parse_us) for lib in LIBRARIES}
        label = f"{len(expressions):,} random crons, next {fires}, {zone}"
        table.append(_row(label, us))
        table.append(_row(f"  parse / construct, {zone}", parse))
        accepted = [e for e in expressions if e not in results["Vortos"].refused]

        def again(zone: str = zone, accepted: list[str] = accepted) -> None:
            start = START.astimezone(ZoneInfo(zone))
            for expr in accepted:
                vortos_run(CronTrigger(expr), start, zone, fires, NEVER)

        cases.append(Case(label, us["Vortos"], again))
    for row in transition_rows:
        us = {lib: med([t.per_next_us for t in ts]) for lib, ts in row.timings.items()}
        table.append(_row(row.label, us))

        def again_window(row: TransitionRow = row) -> None:
            time_window("Vortos", row.expr, row.zone, row.start_ms, row.end_ms, 2_000)

        cases.append(Case(row.label, us["Vortos"], again_window))
    print_table(
        f"Next fire, µs per call (median of {rounds} rounds); Vortos / other < 1: Vortos faster",
        [
            "case",
            "Vortos µs/next",
            "croniter µs/next",
            "cronsim µs/next",
            "Vortos / croniter",
            "Vortos / cronsim",
        ],
        table,
    )
    return cases


def print_refusals(by_zone: dict[str, dict[str, ZoneResult]], count: int, fires: int) -> None:
    refusals = []
    for zone, results in by_zone.items():
        for lib in LIBRARIES:
            res = results[lib]
            refusals.append(
                [
                    f"{lib}, {zone}",
                    num(len(res.refused)),
                    num(count - len(res.refused)),
                    num(res.short),
                    num(res.errored),
                    ", ".join(repr(e) for e in sorted(res.refused)[:3]),
                ]
            )
    print_table(
        f"Random crons refused (skipped for that library only), of {count:,}",
        ["library, zone", "refused", "run", f"fewer than {fires} fires", "by an error", "e.g."],
        refusals,
    )


def print_agreement(by_zone: dict[str, dict[str, ZoneResult]]) -> None:
    agree = []
    notes = []
    for zone, results in by_zone.items():
        for other in ("croniter", "cronsim"):
            both, same, examples = differences(results, zone, other)
            agree.append([f"Vortos vs {other}, {zone}", num(both), num(same), num(both - same)])
            if examples:
                notes.append(f"{zone}, Vortos vs {other}, first differences:")
                notes.extend(examples)
    print_table(
        "Same fires as Vortos (expressions both accept)",
        ["pair, zone", "both run", "same fires", "differ"],
        agree,
    )
    print("\n".join(notes))


def print_flatness(transition_rows: Sequence[TransitionRow]) -> None:
    flat = []
    for row in transition_rows:
        t = row.timings
        transition_us = med([x.per_next_us for x in t["Vortos"]])
        week_us = med([x.per_next_us for x in t["week before"]])
        flat.append(
            [
                row.label,
                row.expr,
                num(t["Vortos"][0].fires),
                num(t["croniter"][0].fires) if "croniter" in t else "-",
                num(t["cronsim"][0].fires),
                num(transition_us, 2),
                num(week_us, 2),
                ratio(transition_us, week_us),
            ]
        )
    print_table(
        "Transition days: fires from 1 h before the transition to 2 h after; Vortos beside the "
        "same hours a week before",
        [
            "case",
            "cron",
            "fires Vortos",
            "fires croniter",
            "fires cronsim",
            "Vortos µs/next",
            "week before µs/next",
            "transition / week before",
        ],
        flat,
    )


def print_slowest(by_zone: dict[str, dict[str, ZoneResult]]) -> None:
    for zone, results in by_zone.items():
        slowest = sorted(results["Vortos"].per_expr_us.items(), key=lambda kv: -kv[1])[:5]
        print(f"Vortos's slowest random crons in {zone}, µs/next (croniter, cronsim):")
        for expr, us in slowest:
            theirs = [results[lib].per_expr_us.get(expr, float("nan")) for lib in LIBRARIES[1:]]
            print(f"  {us:9.1f}  {expr!r}  ({num(theirs[0], 1)}, {num(theirs[1], 1)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 expressions, 20 fires each")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile of Vortos on the slowest case"
    )
    args = parser.parse_args()
    count, fires, rounds = (100, 20, 2) if args.quick else (1_000, 50, 3)
    calls_wanted = 300 if args.quick else 2_000
    wall0, busy0, cpu0 = time.perf_counter(), machine_busy_s(), time.process_time()

    sample = CronTrigger("0 * * * *")
    print(
        f"Vortos's default DST rules: repeated={sample.repeated.value}, "
        f"missing={sample.missing.value}"
    )
    expressions = random_expressions(count)
    by_zone = {zone: run_random(expressions, zone, fires, rounds) for zone in ZONES}
    transition_rows = run_transitions(calls_wanted, rounds)
    cases = print_next_table(expressions, by_zone, transition_rows, fires, rounds)
    print_refusals(by_zone, count, fires)
    print_agreement(by_zone)
    print_flatness(transition_rows)
    print_slowest(by_zone)

    if args.profile:
        worst = max(cases, key=lambda c: c.vortos_us)
        profiler = cProfile.Profile()
        profiler.enable()
        worst.again()
        profiler.disable()
        print(f"\ncProfile of Vortos on the slowest case, {worst.label} (by own time):")
        print(profile_text(profiler, 15))

    others = machine_busy_s() - busy0 - (time.process_time() - cpu0)
    share = others / ((time.perf_counter() - wall0) * cores())
    print(
        f"took {time.perf_counter() - wall0:.1f} s; other processes used {100 * share:.0f}% of "
        f"the {cores()} cores meanwhile"
    )


if __name__ == "__main__":
    main()
