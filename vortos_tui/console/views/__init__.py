"""The console's views. Importing this package registers the built-in ones; a new view is one
module here that calls `register_view`, and one import below."""

from vortos_tui.console.views import approvals, audit, doctor, fires, schedules

__all__ = ["approvals", "audit", "doctor", "fires", "schedules"]
