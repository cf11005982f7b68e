"""The `vortos` command line (Typer)."""

from __future__ import annotations

from vortos_tui.cli.app import app


def main() -> None:
    app(prog_name="vortos")


__all__ = ["app", "main"]
