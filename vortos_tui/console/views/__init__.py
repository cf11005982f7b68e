"""The console's views. Importing this package registers the built-in ones, in jumper order."""

from vortos_tui.console.views import fires, schedules

__all__ = ["fires", "schedules"]
