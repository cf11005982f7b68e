"""Shared CLI state: which database, who is acting."""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from pathlib import Path

import typer

from engine import Engine, open_engine


@dataclass(slots=True)
class CliState:
    db: Path


def state(ctx: typer.Context) -> CliState:
    value = ctx.find_root().obj
    assert isinstance(value, CliState)
    return value


def open_for_write(ctx: typer.Context) -> Engine:
    return open_engine(state(ctx).db, create=True)


def open_existing(ctx: typer.Context) -> Engine:
    """For changes to what is stored: a missing database is an error, not created."""
    return open_engine(state(ctx).db, create=False)


def open_for_read(ctx: typer.Context) -> Engine:
    return open_engine(state(ctx).db, create=False, readonly=True)


def operator() -> str:
    """The acting operator: the OS account running the CLI."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
