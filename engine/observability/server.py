"""Serving /metrics over HTTP from a daemon thread (prometheus_client's WSGI server)."""

from __future__ import annotations

import errno
import threading
from types import TracebackType
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from engine.domain.errors import InvalidInput, VortosError

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

DEFAULT_METRICS_HOST = "127.0.0.1"  # loopback unless asked: metrics name tenants and schedules


class MetricsServer:
    """A running /metrics endpoint; `close()` stops it and frees the port."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one chosen for port 0)."""
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve_metrics(
    registry: CollectorRegistry, port: int, host: str = DEFAULT_METRICS_HOST
) -> MetricsServer:
    """Serve `registry` at http://host:port/metrics (any path answers) from a daemon thread.

    Binds before returning: a port already in use raises VortosError (exit code 1) saying so.
    """
    from prometheus_client import start_http_server  # noqa: PLC0415 (only when serving)

    if not 0 <= port <= 65535:
        raise InvalidInput(f"metrics port {port} is out of range: use 1 to 65535")
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise VortosError(
                f"cannot serve metrics on {host}:{port}: the port is in use by another "
                "process; choose a free one with --metrics-port (or VORTOS_METRICS_PORT)"
            ) from None
        raise VortosError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} (check "
            "--metrics-host: it must be an address of this machine)"
        ) from None
    return MetricsServer(server, thread)
