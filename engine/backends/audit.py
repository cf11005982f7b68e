"""Moved to engine.backends.sql.audit: this path stays only while engine/governance/archive.py,
engine/retention/audit_upkeep.py and vortos_tui/cli/audit.py import it from here."""

from engine.backends.sql.audit import Anchor, SqlAuditLog, anchor_message

__all__ = ["Anchor", "SqlAuditLog", "anchor_message"]
