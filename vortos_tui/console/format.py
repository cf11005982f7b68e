"""How the console spells instants, durations, triggers, states and outcomes."""

from __future__ import annotations

from functools import lru_cache
from zoneinfo import ZoneInfo

from cron_descriptor import FormatException, Options, get_description
from rich.text import Text

from engine import CronTrigger, IntervalTrigger, OneShotTrigger, RecentRun, RunState, Trigger
from engine.domain.control_chars import steering, visible
from engine.domain.timeutil import format_duration, local

STATE_STYLE: dict[str, str] = {
    "dispatched": "cyan",
    "running": "bold blue",
    "completed": "green",
    "failed": "bold red",
    "dead_lettered": "bold magenta",
    "timed_out": "bold red",
    "skipped": "dim",
    "cancelled": "yellow",
    "active": "green",
    "paused": "yellow",
    "disabled": "dim",
}
# Bar heights by duration; colour by outcome. A run with no duration (never started) is a dot.
_BARS = "▁▂▃▄▅▆▇█"


def plain(value: Text | str, *, one_line: bool = False) -> Text:
    """Stored text as the console may show it: Textual writes an ESC, a C1 character or a
    bidi override in a cell straight to the terminal (it cleared the screen, set the title and
    reordered a line), so each is spelled out (ESC as the four characters \\x1b), styles kept;
    with `one_line` a newline too, so a note cannot start a forged row of a facts grid."""
    # Every cell of every list passes here on each refresh: look first, spell only if needed.
    source = value if isinstance(value, str) else value.plain
    cuts = steering(source, one_line=one_line)
    if isinstance(value, str):
        return Text(visible(value, one_line=one_line) if cuts else value)
    if not cuts:
        return value
    shown = value.blank_copy()
    for part in value.divide(sorted({*cuts, *(i + 1 for i in cuts)})):
        spelled = visible(part.plain, one_line=one_line)
        piece = part
        if spelled != part.plain:  # one character, spelled out in the styles it had
            piece = Text(spelled)
            for span in part.spans:
                piece.stylize(span.style)
        shown.append_text(piece)
    return shown


def state_text(state: str) -> Text:
    return Text(state.replace("_", " "), style=STATE_STYLE.get(state, ""))


def in_words(delta_ms: int) -> str:
    """'in 3m', '2h ago', 'now': coarse, for a glance."""
    ahead = delta_ms >= 0
    seconds = abs(delta_ms) // 1000
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")):
        if seconds >= size:
            text = f"{seconds // size}{unit}"
            break
    else:
        return "now"
    return f"in {text}" if ahead else f"{text} ago"


def clock_time(ms: int, zone: ZoneInfo) -> str:
    return local(ms, zone.key).strftime("%H:%M:%S")


def instant(ms: int | None, zone: ZoneInfo, now_ms: int | None = None) -> str:
    """An instant in the operator's zone: the time alone when it is today, else the date too."""
    if ms is None:
        return "-"
    moment = local(ms, zone.key)
    if now_ms is not None and local(now_ms, zone.key).date() == moment.date():
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M")


def full_instant(ms: int | None, zone: ZoneInfo) -> str:
    if ms is None:
        return "-"
    return local(ms, zone.key).strftime("%Y-%m-%d %H:%M:%S %Z")


def duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    return format_duration(ms - ms % 1000)


@lru_cache(maxsize=4096)
def _cron_words(expression: str) -> str:
    options = Options()
    options.use_24hour_time_format = True
    options.verbose = False
    try:
        return str(get_description(expression, options))
    except (FormatException, ValueError, KeyError, IndexError):
        # A form the describer does not know (our parser accepted it): say it as written.
        return f"cron {expression}"


def trigger_words(trigger: Trigger) -> str:
    """'At 02:30', 'Every 5 minutes', 'every 30s', 'once at …'."""
    if isinstance(trigger, CronTrigger):
        return _cron_words(trigger.expression)
    if isinstance(trigger, IntervalTrigger):
        return f"every {format_duration(trigger.every_ms)}"
    if isinstance(trigger, OneShotTrigger):
        return trigger.describe()
    return trigger.describe()


def sparkline(recent: tuple[RecentRun, ...]) -> Text:
    """One cell per run, oldest first: height by duration (relative to the longest shown),
    colour by outcome."""
    longest = max((r.duration_ms or 0 for r in recent), default=0)
    out = Text()
    for run in recent:
        style = STATE_STYLE.get(run.state.value, "")
        if run.state in (RunState.FAILED, RunState.DEAD_LETTERED, RunState.TIMED_OUT):
            out.append("✗", style=style)
        elif run.duration_ms is None:
            out.append("·", style=style)
        else:
            # All instant (or no durations at all): mid-height bars, the colour tells.
            scale = run.duration_ms / longest if longest else 0.5
            out.append(_BARS[min(len(_BARS) - 1, int(scale * (len(_BARS) - 1)))], style=style)
    return out
