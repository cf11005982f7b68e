"""How the CLI speaks: Rich tables for people, JSON for scripts, errors on stderr."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from typer._click.exceptions import ClickException

from engine.domain.errors import VortosError
from engine.domain.redact import scrub

EXIT_CODES = """\
Exit codes: 0 ok · 1 error (storage, unexpected) · 2 usage or invalid input ·
3 not found · 4 not permitted · 5 conflict or stale · 6 waiting for approval.
"""

P = ParamSpec("P")
R = TypeVar("R")

stdout = Console(highlight=False, soft_wrap=False)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

log = logging.getLogger("vortos.cli")


def emit_json(value: Any) -> None:
    """Only JSON goes to stdout under --json, so `| jq` always works."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
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
            raise fail(str(exc), exc.exit_code) from None
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
