"""The console in a real terminal: `vortos-tui --demo` under tmux at 80x24, driven by keys sent
with send-keys and judged by what capture-pane reads back (what an operator over SSH sees, not
what Pilot simulates).

Each test starts its own tmux server on a private socket, so nothing here touches (or is touched
by) anyone's tmux sessions.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine import open_engine
from engine.ports.lease import LEADER_LEASE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("tmux") is None,
        reason="tmux is not on PATH: these tests run the console inside a real tmux terminal",
    ),
]

WIDTH, HEIGHT = 80, 24
SCREEN_TIMEOUT_S = 20.0
REPO = Path(__file__).resolve().parents[2]
DEMO_NAMES = ("heartbeat", "nightly-report", "weekly-cleanup")
# Variables that change how Textual draws or how big it thinks the terminal is.
DROPPED_ENV = ("NO_COLOR", "TEXTUAL_THEME", "TEXTUAL_ANIMATIONS", "COLUMNS", "LINES")


def console_command() -> list[str]:
    """This interpreter's installed `vortos-tui` script, else the same entry point by module."""
    script = Path(sys.executable).with_name("vortos-tui")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "vortos_tui.console"]


def terminal_env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("VORTOS_", "TMUX")) and key not in DROPPED_ENV
    }
    env["TERM"] = "xterm-256color"
    # `python -m vortos_tui.console` (no installed script) runs from the test's own directory.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


class Terminal:
    """One private tmux server running one command in a WIDTH x HEIGHT pane."""

    def __init__(self, workdir: Path) -> None:
        self.socket = f"vortos-test-{uuid.uuid4().hex[:12]}"
        self.exit_file = workdir / "console.exit"
        self.env = terminal_env()
        self.socket_path: Path | None = None

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=10,
            check=False,
        )

    def start(self, argv: list[str], cwd: Path) -> None:
        # The console's stderr stays on the terminal: Textual may draw there. The shell around
        # it records the console's own exit code once the pane's program ends.
        script = f"{shlex.join(argv)}; echo EXIT=$? > {shlex.quote(str(self.exit_file))}"
        inner = ["env", *(arg for name in DROPPED_ENV for arg in ("-u", name))]
        inner.append("TERM=xterm-256color")
        started = self.tmux(
            "new-session",
            "-d",
            "-s",
            "console",
            "-x",
            str(WIDTH),
            "-y",
            str(HEIGHT),
            "-c",
            str(cwd),
            *inner,
            "sh",
            "-c",
            script,
        )
        assert started.returncode == 0, started.stderr
        where = self.tmux("display-message", "-p", "#{socket_path}")
        if where.returncode == 0 and where.stdout.strip():
            self.socket_path = Path(where.stdout.strip())

    def size(self) -> str:
        shown = self.tmux("display-message", "-p", "-t", "console", "#{pane_width}x#{pane_height}")
        assert shown.returncode == 0, shown.stderr
        return shown.stdout.strip()

    def screen(self) -> str:
        captured = self.tmux("capture-pane", "-p", "-t", "console")
        assert captured.returncode == 0, captured.stderr
        return captured.stdout

    def keys(self, *keys: str) -> None:
        """tmux key names (Enter, Escape, End) or single characters."""
        sent = self.tmux("send-keys", "-t", "console", *keys)
        assert sent.returncode == 0, sent.stderr

    def type(self, text: str) -> None:
        sent = self.tmux("send-keys", "-t", "console", "-l", text)
        assert sent.returncode == 0, sent.stderr

    def wait_screen(
        self, shows: Callable[[str], bool], what: str, timeout: float = SCREEN_TIMEOUT_S
    ) -> str:
        """Poll the pane until `shows(screen)` holds; fail with the last screen otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if shows(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{screen}")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", "console").returncode == 0

    def close(self) -> None:
        self.tmux("kill-server")
        if self.socket_path is not None:  # tmux leaves its socket file behind
            self.socket_path.unlink(missing_ok=True)


def containing(*words: str) -> Callable[[str], bool]:
    return lambda screen: all(word in screen for word in words)


def row(screen: str, first_cell: str) -> str | None:
    """The screen line of the table row whose first cell is `first_cell`."""
    for line in screen.splitlines():
        cells = line.split()
        if cells and cells[0] == first_cell:
            return line
    return None


def cell(screen: str, first_cell: str, column: str) -> str | None:
    """One cell of a table row, cut at the header's column positions (a cell starts where its
    header label starts and ends where the next label starts)."""
    header = next((line for line in screen.splitlines() if f" {column} " in line), None)
    line = row(screen, first_cell)
    if header is None or line is None:
        return None
    start = header.index(f" {column} ") + 1
    end = start + len(column)
    while end < len(header) and header[end] == " ":
        end += 1
    return line[start:end].strip()


def names_the_leader(screen: str) -> bool:
    """The header's second line: `leader NODE renewed ...  sched A/B  open N  run N  dead N`."""
    lines = screen.splitlines()
    return len(lines) > 1 and lines[1].split()[:1] == ["leader"] and "sched" in lines[1]


def lease_holder(db: Path) -> str | None:
    with open_engine(db, create=False, readonly=True) as engine:
        lease = engine.storage.leases.current(LEADER_LEASE)
    return None if lease is None else lease.holder


ConsoleStarter = Callable[[str], Terminal]


@pytest.fixture
def start_console(tmp_path: Path) -> Iterator[ConsoleStarter]:
    """Start `vortos-tui --demo --db DB` (DB relative to tmp_path) and wait for its Schedules
    view to show the demo's rows."""
    started: list[Terminal] = []

    def start(db: str) -> Terminal:
        terminal = Terminal(tmp_path)
        started.append(terminal)
        terminal.start([*console_command(), "--db", db, "--demo", "--zone", "UTC"], cwd=tmp_path)
        terminal.wait_screen(containing("NAME", "LAST", *DEMO_NAMES), "the Schedules view")
        return terminal

    yield start
    for terminal in started:
        terminal.close()


@pytest.fixture
def console(start_console: ConsoleStarter, tmp_path: Path) -> tuple[Terminal, Path]:
    """The console on `v.db` in tmp_path, named relatively so its header fits in 80 columns."""
    return start_console("v.db"), tmp_path / "v.db"


def test_the_schedules_view_shows_the_demo_and_the_leading_node_at_80x24(
    console: tuple[Terminal, Path],
) -> None:
    terminal, _ = console
    assert terminal.size() == f"{WIDTH}x{HEIGHT}"
    screen = terminal.wait_screen(
        lambda screen: "node leader" in screen and names_the_leader(screen),
        "the header saying this node leads, and which node that is",
    )
    header = screen.splitlines()[0]
    assert "v.db" in header, screen
    assert "node leader" in header, screen
    assert "UTC" in header, screen
    for name in DEMO_NAMES:
        assert row(screen, name) is not None, f"no {name} row:\n{screen}"
    weekly = row(screen, "weekly-cleanup")
    assert weekly is not None, screen
    assert "paused" in weekly, screen


def test_a_demo_fire_runs_and_its_outcome_shows_in_the_last_column(
    console: tuple[Terminal, Path],
) -> None:
    terminal, _ = console
    terminal.wait_screen(
        lambda screen: cell(screen, "heartbeat", "LAST") == "completed",
        "heartbeat's LAST cell to say completed",
        timeout=15,
    )


def test_colon_fires_enter_switches_to_the_live_fires_view(
    console: tuple[Terminal, Path],
) -> None:
    terminal, _ = console
    terminal.keys(":")
    terminal.wait_screen(
        containing("every run, newest first", "every schedule, due soonest first"),
        "the view jumper listing the views",
    )
    terminal.type("fires")
    terminal.wait_screen(
        lambda screen: (
            "every run, newest first" in screen
            and "every schedule, due soonest first" not in screen
        ),
        "the jumper narrowed to the fires view",
    )
    terminal.keys("Enter")
    screen = terminal.wait_screen(
        lambda screen: (
            "SLOT" in screen
            and "STATE" in screen
            and any(line.split()[1:2] == ["heartbeat"] for line in screen.splitlines())
        ),
        "the Live fires view with a heartbeat fire",
    )
    assert "every run, newest first" not in screen, "the jumper is still open:\n" + screen
    assert row(screen, "NAME") is None, "the Schedules table is still shown:\n" + screen


def test_question_mark_opens_the_help_and_escape_closes_it(
    console: tuple[Terminal, Path],
) -> None:
    terminal, _ = console
    terminal.keys("?")
    terminal.wait_screen(containing("Keys", "KEY", "DOES"), "the help")
    terminal.keys("Escape")
    screen = terminal.wait_screen(
        lambda screen: "Keys" not in screen and "DOES" not in screen,
        "the help to close",
    )
    terminal.wait_screen(containing("NAME", "LAST", *DEMO_NAMES), "the Schedules view again")
    assert terminal.alive(), "escape on the help quit the console:\n" + screen


def test_the_header_names_the_leader_at_80_columns_with_a_long_database_path(
    start_console: ConsoleStarter, tmp_path: Path
) -> None:
    folder = tmp_path / ("a-database-folder-with-a-long-name-" * 2)
    folder.mkdir()
    terminal = start_console(str(folder / "v.db"))  # the path alone is wider than 80 columns
    terminal.wait_screen(
        lambda screen: cell(screen, "heartbeat", "LAST") == "completed",
        "a demo fire (this node leads once one has run)",
    )
    # The header is redrawn on every refresh (500 ms): a few seconds are plenty.
    terminal.wait_screen(names_the_leader, "the header's second line naming the leader", 5)


def test_the_help_lists_q_for_quit_with_its_binding_id(console: tuple[Terminal, Path]) -> None:
    terminal, _ = console
    terminal.keys("?")
    terminal.wait_screen(containing("Keys", "KEY", "DOES"), "the help")
    terminal.keys("End")  # at 80x24 the help scrolls; its end holds the console's own keys
    screen = terminal.wait_screen(
        containing("Views (: then the name)", "toggle-live"), "the end of the help"
    )
    assert re.search(r"\sq\s+Quit\s+quit\s", screen), screen


def test_q_quits_with_exit_code_0_and_releases_the_leader_lease(
    console: tuple[Terminal, Path],
) -> None:
    terminal, db = console
    terminal.wait_screen(containing("node leader"), "this node to lead")
    assert lease_holder(db) is not None, "the console's engine leads but no lease is stored"
    terminal.keys("q")
    deadline = time.monotonic() + SCREEN_TIMEOUT_S
    while not terminal.exit_file.exists() or terminal.alive():
        if time.monotonic() > deadline:
            raise AssertionError(f"the console did not quit within {SCREEN_TIMEOUT_S}s of q")
        time.sleep(0.1)
    assert terminal.exit_file.read_text().strip() == "EXIT=0"
    # The lease lives 15 s: still holding it here means the console quit without releasing.
    assert lease_holder(db) is None


def readme_run_it() -> list[str]:
    """The README's "Run it" command, after its `pip install . &&`."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    found = re.search(r"\*\*Run it\*\*.*?```sh\n(.+?)\n```", readme, re.S)
    assert found is not None, "the README has no Run it command"
    install, sep, run = found.group(1).partition(" && ")
    assert (install, sep) == ("pip install .", " && "), found.group(1)
    return shlex.split(run)


def test_the_readme_run_it_command_opens_the_console_on_the_demo_data(tmp_path: Path) -> None:
    """Acceptance 0: the README's first command, run as written in a fresh directory, is the
    live console on the demo schedules."""
    argv = readme_run_it()
    assert argv[0] == "vortos-tui", argv
    terminal = Terminal(tmp_path)
    try:
        terminal.start([*console_command(), *argv[1:]], cwd=tmp_path)
        terminal.wait_screen(containing("NAME", "LAST", *DEMO_NAMES), "the demo schedules")
        terminal.wait_screen(
            lambda screen: cell(screen, "heartbeat", "LAST") == "completed", "a demo fire"
        )
        assert (tmp_path / "vortos.db").is_file()  # the default database, in the working dir
    finally:
        terminal.close()
