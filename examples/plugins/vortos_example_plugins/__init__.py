"""Example Vortos plug-ins, built only on the public extension surface (engine.extend).

- `filelock` (entry point in `vortos.lease_drivers`): FileLockLease, leases as files under an
  exclusive flock, for processes on one host.
- `jsonl` (entry point in `vortos.audit_sinks`): JsonlAuditSink, a JSON-lines copy of the
  audit trail.
"""

from __future__ import annotations

from vortos_example_plugins.file_lease import FileLockLease
from vortos_example_plugins.jsonl_sink import DamagedCopy, JsonlAuditSink, read_copy

__all__ = ["DamagedCopy", "FileLockLease", "JsonlAuditSink", "read_copy"]
