"""The `vortos` command line (Typer)."""

from __future__ import annotations

from vortos_tui.cli.app import app
from vortos_tui.cli.output import run_typer


def main() -> None:
    """Run the CLI; a usage mistake is one line on stderr, like every other error."""
    run_typer(app, "vortos")


__all__ = ["app", "main", "run_typer"]
