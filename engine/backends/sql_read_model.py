"""Moved to engine.backends.sql.read_model: this path stays only while bench/console.py
imports it from here."""

from engine.backends.sql.read_model import DUE

__all__ = ["DUE"]
