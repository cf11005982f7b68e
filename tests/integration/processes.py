"""Real `vortos run` processes for integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.conftest import cli_env


class Daemon:
    """One `vortos run` process, its output in a log file."""

    def __init__(
        self,
        db: Path | str,
        node_id: str,
        log_dir: Path,
        lease_ttl: str = "2s",
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.node_id = node_id
        self.log_path = log_dir / f"{node_id}.log"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vortos_tui.cli",
                    "--db",
                    str(db),
                    "run",
                    "--lease-ttl",
                    lease_ttl,
                    "--node-id",
                    node_id,
                    "--log-level",
                    "info",
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=cli_env(env),
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def terminate(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(20)

    @property
    def log(self) -> str:
        return self.log_path.read_text()


def wait_for(condition: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> None:
    """Poll `condition` until it holds, or fail after `timeout` seconds saying `what`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)
