"""The control socket: operators' changes made by the service account's process, as the account
the kernel reports on the other end (see server.py)."""

from engine.control.client import ControlClient, ControlUnavailable, RemoteService
from engine.control.server import ControlServer

__all__ = ["ControlClient", "ControlServer", "ControlUnavailable", "RemoteService"]
