"""Governance: the audit chain's keys and verification (policy, four-eyes and roles follow)."""
