"""The control socket: operators' changes made by the service account's process, as the account
the kernel reports on the other end (see server.py)."""

from engine.control.client import ControlClient, RemoteService
from engine.control.server import ControlServer
from engine.control.wire import ControlUnavailable, ServerBusy

__all__ = ["ControlClient", "ControlServer", "ControlUnavailable", "RemoteService", "ServerBusy"]
