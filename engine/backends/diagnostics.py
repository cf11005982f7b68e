"""Moved to engine.backends.sql.diagnostics: this path stays only while engine/service/site.py
imports it from here."""

from engine.backends.sql.diagnostics import store_counts

__all__ = ["store_counts"]
