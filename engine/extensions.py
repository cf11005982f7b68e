"""Temporary: the old path of engine.plugins.runtime, kept only until engine/api.py imports
from engine.plugins.runtime (helper B2 deletes this module then). Import from
engine.plugins.runtime."""

from engine.plugins.runtime import Builder, access_for, build_runtime, doctor_checks, leases_for

__all__ = ["Builder", "access_for", "build_runtime", "doctor_checks", "leases_for"]
