"""`vortos-tui --web`: the console served to a browser through textual-serve, which has no
authentication. So it listens on 127.0.0.1 only, and its browser sessions are read-only unless
--web-allow-actions is given (and that flag means nothing, so is refused, without --web).

The servers here are real `vortos-tui --web --demo` processes on a free port.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import open_engine
from engine.backends.registry import parse_database
from engine.ports.lease import LEADER_LEASE
from tests.cli.support import assert_clean_error
from tests.conftest import CliResult, cli_env
from vortos_tui.cli.context import CliState
from vortos_tui.console.web import WEB_HOST, session_command

needs_textual_serve = pytest.mark.skipif(
    importlib.util.find_spec("textual_serve") is None,
    reason="textual-serve is not installed: pip install -e '.[web]'",
)

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0  # the demo's slowest command takes 4 s, within the engine's grace
START_LINE = re.compile(r"vortos console on http://(?P<host>[\d.]+):(?P<port>\d+) for ")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((WEB_HOST, 0))
        return int(probe.getsockname()[1])


def accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def non_loopback_ipv4() -> str | None:
    """One IPv4 address of this host outside 127.0.0.0/8, if it has any."""
    candidates: list[str] = []
    with contextlib.suppress(OSError):
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # a UDP connect only picks a route: nothing is sent
        candidates.append(probe.getsockname()[0])
    if shutil.which("ip"):
        shown = subprocess.run(
            ["ip", "-4", "-o", "addr", "show"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        candidates += re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", shown.stdout)
    return next((a for a in candidates if not a.startswith(("127.", "0."))), None)


def lease_holder(db: Path) -> str | None:
    with open_engine(db, create=False, readonly=True) as engine:
        lease = engine.storage.leases.current(LEADER_LEASE)
    return None if lease is None else lease.holder


class WebServer:
    """One `vortos-tui --web --demo` process; its output goes to files (never an unread pipe)."""

    def __init__(self, workdir: Path, *flags: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.db = workdir / "w.db"
        self.port = free_port()
        self.stdout_path = workdir / "web.stdout"
        self.stderr_path = workdir / "web.stderr"
        argv = [sys.executable, "-m", "vortos_tui.console", "--web", "--web-port", str(self.port)]
        argv += ["--db", str(self.db), "--demo", *flags]
        with self.stdout_path.open("w") as out, self.stderr_path.open("w") as err:
            self.process = subprocess.Popen(argv, stdout=out, stderr=err, env=cli_env())
        self.start_line = self._wait_started()

    def output(self) -> str:
        return f"stdout:\n{self.stdout_path.read_text()}\nstderr:\n{self.stderr_path.read_text()}"

    def _wait_started(self) -> str:
        """The start line on stderr, once the port also accepts connections."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"exited {self.process.returncode}:\n{self.output()}")
            found = next(
                (
                    line
                    for line in self.stderr_path.read_text().splitlines()
                    if START_LINE.search(line)
                ),
                None,
            )
            if found is not None and accepts(WEB_HOST, self.port):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"not serving after {START_TIMEOUT_S}s:\n{self.output()}")
            time.sleep(0.05)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(
                f"still running {STOP_TIMEOUT_S}s after {signal.Signals(signum).name}:\n"
                + self.output()
            ) from None


@pytest.fixture(scope="module")
def read_only_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """One server without --web-allow-actions, shared by the tests that only look at it."""
    if importlib.util.find_spec("textual_serve") is None:
        pytest.skip("textual-serve is not installed: pip install -e '.[web]'")
    server = WebServer(tmp_path_factory.mktemp("web"))
    yield server
    assert server.stop() == 0, server.output()


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[list[WebServer]]:
    """Servers a test starts itself; any still running at the end are stopped."""
    started: list[WebServer] = []
    yield started
    for server in started:
        if server.process.poll() is None:
            server.stop()


def run_console(*args: str) -> CliResult:
    done = subprocess.run(
        [sys.executable, "-m", "vortos_tui.console", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


# -- serving -------------------------------------------------------------------------------


def test_web_listens_on_127_0_0_1(read_only_server: WebServer) -> None:
    found = START_LINE.search(read_only_server.start_line)
    assert found is not None
    assert found["host"] == "127.0.0.1"
    assert int(found["port"]) == read_only_server.port
    assert accepts("127.0.0.1", read_only_server.port)


def test_web_is_not_reachable_on_a_non_loopback_address(read_only_server: WebServer) -> None:
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address to try")
    assert not accepts(address, read_only_server.port), (
        f"the console answers on {address}: it must listen on the loopback interface only"
    )


def test_web_serves_the_console_page_over_http(read_only_server: WebServer) -> None:
    url = f"http://127.0.0.1:{read_only_server.port}/"
    with urllib.request.urlopen(url, timeout=10) as response:
        status = response.status
        content_type = response.headers.get("Content-Type", "")
        body = response.read().decode("utf-8")
    assert status == 200
    assert content_type.startswith("text/html"), content_type
    assert "<html" in body.lower()


def test_web_start_line_says_read_only_and_loopback_only(read_only_server: WebServer) -> None:
    line = read_only_server.start_line
    assert "read-only" in line
    assert "--web-allow-actions" in line, "it should say how to allow verbs"
    assert "ALLOWED" not in line
    assert "loopback only" in line
    assert "no authentication" in line


@needs_textual_serve
def test_web_allow_actions_start_line_says_actions_allowed(
    web_server: list[WebServer], tmp_path: Path
) -> None:
    server = WebServer(tmp_path / "allowed", "--web-allow-actions")
    web_server.append(server)
    assert "actions ALLOWED" in server.start_line
    assert "read-only" not in server.start_line
    assert "loopback only" in server.start_line
    assert accepts("127.0.0.1", server.port)


@needs_textual_serve
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_web_server_and_releases_the_lease(
    signum: int, web_server: list[WebServer], tmp_path: Path
) -> None:
    server = WebServer(tmp_path / "stopped")
    web_server.append(server)
    deadline = time.monotonic() + START_TIMEOUT_S
    while lease_holder(server.db) is None:  # the engine beside the server leads
        assert time.monotonic() < deadline, "the web server's engine never took the lease"
        time.sleep(0.05)
    assert server.stop(signum) == 0, server.output()
    assert not accepts(WEB_HOST, server.port)
    # The lease lives 15 s: still holding it here means the engine stopped without releasing.
    assert lease_holder(server.db) is None


# -- what a browser session runs -----------------------------------------------------------


def test_browser_sessions_are_read_only_without_web_allow_actions(tmp_path: Path) -> None:
    cli = CliState(db=parse_database(tmp_path / "w.db"))
    argv = session_command(cli, allow_actions=False, zone_name="UTC", refresh="500ms")
    assert "--read-only" in argv


def test_browser_sessions_may_act_with_web_allow_actions(tmp_path: Path) -> None:
    cli = CliState(db=parse_database(tmp_path / "w.db"))
    argv = session_command(cli, allow_actions=True, zone_name="UTC", refresh="500ms")
    assert "--read-only" not in argv


def test_browser_sessions_attach_to_the_served_database(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    argv = session_command(
        CliState(db=parse_database(db)), allow_actions=True, zone_name="UTC", refresh="1s"
    )
    assert argv[:3] == [sys.executable, "-m", "vortos_tui.console"]
    assert "--attach" in argv, "each session must not start a second engine"
    assert argv[argv.index("--db") + 1] == str(db.resolve())
    assert argv[argv.index("--zone") + 1] == "UTC"
    assert argv[argv.index("--refresh") + 1] == "1s"


# -- refused -------------------------------------------------------------------------------


def test_web_allow_actions_without_web_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    result = run_console("--db", str(db), "--web-allow-actions")
    assert_clean_error(result, 2, "--web-allow-actions", "--web")
    assert not db.exists(), "a refused command must change nothing"


def test_read_only_web_with_web_allow_actions_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    result = run_console("--db", str(db), "--read-only", "--web", "--web-allow-actions")
    assert_clean_error(result, 2, "--read-only", "--web-allow-actions")
    assert not db.exists(), "a refused command must change nothing"
