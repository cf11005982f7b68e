"""`vortos-tui`: the operations console (Textual)."""

from __future__ import annotations

import typer

from vortos_tui.cli.output import EXIT_CODES, handles_errors, run_typer
from vortos_tui.console.main import console

tui = typer.Typer(
    name="vortos-tui",
    epilog=EXIT_CODES,
    pretty_exceptions_enable=False,
    add_completion=False,
)
tui.command(epilog=EXIT_CODES)(handles_errors(console))


def main() -> None:
    run_typer(tui, "vortos-tui")


def __getattr__(name: str) -> object:
    # VortosConsole (Textual) loads on first use: `vortos` imports this package for its options.
    if name == "VortosConsole":
        from vortos_tui.console.app import VortosConsole  # noqa: PLC0415

        return VortosConsole
    raise AttributeError(name)


__all__ = ["VortosConsole", "main", "tui"]
