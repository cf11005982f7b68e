"""Vortos's operator front: the Typer CLI (and, with the console issue, the Textual console)."""
