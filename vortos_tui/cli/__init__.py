"""The `vortos` command line (Typer)."""

from __future__ import annotations

import sys

from typer._click.exceptions import ClickException

from vortos_tui.cli.app import app
from vortos_tui.cli.output import fail


def main() -> None:
    """Run the CLI; a usage mistake is one line on stderr, like every other error."""
    try:
        code = app(prog_name="vortos", standalone_mode=False)
    except ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(exc.exit_code)  # the help was shown: nothing more to say
        context = getattr(exc, "ctx", None)
        where = f" (see `{context.command_path} --help`)" if context is not None else ""
        message = " ".join(exc.format_message().split())
        raise SystemExit(fail(f"{message}{where}", exc.exit_code).exit_code) from None
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
