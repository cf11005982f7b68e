"""How the CLI speaks: Rich tables for people, JSON for scripts, errors on stderr."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

import typer
from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text
from typer._click.exceptions import ClickException

from engine.domain.control_chars import STEERING_CODES, visible
from engine.domain.errors import VortosError
from engine.domain.redact import scrub
from vortos_tui.cli.flags import as_flags

EXIT_CODES = """\
Exit codes: 0 ok · 1 error (storage, unexpected) · 2 usage or invalid input ·
3 not found · 4 not permitted · 5 conflict or stale · 6 waiting for approval.
"""

P = ParamSpec("P")
R = TypeVar("R")


class PlainConsole(Console):
    """A console that the text it shows cannot steer.

    What we print holds stored text from other people and programs (notes, reasons, metadata,
    payloads, a run's output tail, audit data, plug-in names). Rich removes only BEL, BS, VT,
    FF and CR; an ESC or a C1 character would reach the terminal and could erase a line and
    forge another, set the title or clear the screen. So every control character (and bidi
    override) is spelled out visibly (ESC as the four characters \\x1b): in each string before
    Rich measures it, and in every segment written, whatever renderable (a Text too) made it.
    Markup and emoji codes are off: stored text is shown as written, never as styling or a
    hyperlink."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, emoji=False, highlight=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(text), **kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            # Control segments are Rich's own (cursor moves it means); their text is not ours.
            yield segment if segment.control else segment._replace(text=visible(segment.text))


stdout = PlainConsole(soft_wrap=False)
stderr = PlainConsole(stderr=True, soft_wrap=True)


def one_line(text: str) -> str:
    """Stored text shown on one line (a table cell, a `key value` line): a newline in it is
    spelled \\n, so it cannot start a line of its own that looks like ours."""
    return visible(text, one_line=True)


log = logging.getLogger("vortos.cli")


# json.dumps escapes C0 but writes DEL, C1 (U+009B is a CSI) and bidi overrides raw; JSON read
# in a terminal is shown too, so they are written as \u escapes (the same string to a parser).
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in STEERING_CODES if code >= 0x7F}


def emit_json(value: Any) -> None:
    """Only JSON goes to stdout under --json, so `| jq` always works."""
    text = json.dumps(value, indent=2, ensure_ascii=False).translate(_JSON_ESCAPES)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def say(message: str) -> None:
    """A message for a person: stderr, so stdout stays clean for data."""
    stderr.print(message, markup=False)


def fail(message: str, code: int) -> typer.Exit:
    # Scrubbed: a driver's or a plug-in's text may quote a URL (or a piece of its password).
    stderr.print(f"error: {scrub(message)}", style="bold red", markup=False)
    return typer.Exit(code)


def handles_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn engine errors into one line on stderr and the documented exit code."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except VortosError as exc:
            raise fail(as_flags(str(exc)), exc.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            if os.environ.get("VORTOS_DEBUG"):
                raise
            raise fail(
                f"unexpected {type(exc).__name__}: {exc} (this is a bug; re-run with "
                "VORTOS_DEBUG=1 for the traceback and report it)",
                1,
            ) from None

    return wrapper


def run_typer(typer_app: typer.Typer, prog_name: str) -> None:
    """Run a Typer app so that a usage mistake is one line on stderr and exit code 2."""
    try:
        code = typer_app(prog_name=prog_name, standalone_mode=False)
    except ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(exc.exit_code)  # the help was shown: nothing more to say
        context = getattr(exc, "ctx", None)
        where = f" (see `{context.command_path} --help`)" if context is not None else ""
        message = " ".join(exc.format_message().split())
        raise SystemExit(fail(f"{message}{where}", exc.exit_code).exit_code) from None
    sys.exit(code if isinstance(code, int) else 0)
