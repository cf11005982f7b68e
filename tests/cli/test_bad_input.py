"""Acceptance 7: bad input gets a clear one-line error, its exit code, and changes nothing.

Every case runs the real CLI in a subprocess against its own copy of a seeded database (schedules in
two tenants, dispatched runs, a lease row) and compares the database's full content, read through
the stdlib sqlite3 module, before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.support import (
    assert_clean_error,
    assert_usage_error,
    checkpoint,
    cli_json,
    copy_database,
    db_state,
)
from tests.conftest import CliResult, cli_env, run_cli

NOBODY = 65534
ADD_OK = ("--every", "1m", "--command", "noop")  # a valid trigger and command, to vary one thing
HUGE_PAYLOAD = json.dumps({"blob": "x" * (64 * 1024)})


def add(db: Path, name: str, *options: str) -> CliResult:
    return run_cli("schedule", "add", name, *options, db=db)


# -- schedule add: one bad value at a time --------------------------------------------------------

MALFORMED_CRONS = [
    pytest.param("61 * * * *", id="minute-out-of-range"),
    pytest.param("* * *", id="too-few-fields"),
    pytest.param("* * * * * * *", id="too-many-fields"),
    pytest.param("every day", id="words"),
    pytest.param("", id="empty"),
    pytest.param("*/0 * * * *", id="zero-step"),
    pytest.param("0 0 31 2 *", id="never-matches"),
]


@pytest.mark.parametrize("expression", MALFORMED_CRONS)
def test_malformed_cron_is_refused(seeded_db: Path, expression: str) -> None:
    before = db_state(seeded_db)
    result = add(seeded_db, "fresh-job", "--cron", expression, "--command", "noop")
    assert_clean_error(result, 2, "cron")
    assert db_state(seeded_db) == before


@pytest.mark.parametrize(
    "zone",
    [
        pytest.param("Mars/Olympus", id="unknown"),
        pytest.param("", id="empty"),
        pytest.param("../../etc/passwd", id="path-traversal"),
    ],
)
def test_unknown_zone_is_refused(seeded_db: Path, zone: str) -> None:
    before = db_state(seeded_db)
    result = add(seeded_db, "fresh-job", "--cron", "0 * * * *", "--tz", zone, "--command", "noop")
    assert_clean_error(result, 2, "zone")
    assert db_state(seeded_db) == before


@pytest.mark.parametrize(
    "every",
    [
        pytest.param("0", id="zero"),
        pytest.param("0s", id="zero-seconds"),
        pytest.param("-5s", id="negative"),
        pytest.param("500ms", id="under-a-second"),
        pytest.param("fortnightly", id="not-a-duration"),
    ],
)
def test_bad_interval_is_refused(seeded_db: Path, every: str) -> None:
    before = db_state(seeded_db)
    result = add(seeded_db, "fresh-job", "--every", every, "--command", "noop")
    assert_clean_error(result, 2, "interval")
    assert db_state(seeded_db) == before


def test_interval_too_large_to_represent_is_refused_as_input(seeded_db: Path) -> None:
    before = db_state(seeded_db)
    result = add(seeded_db, "fresh-job", "--every", "99999999999999999999d", "--command", "noop")
    assert_clean_error(result, 2, "interval")
    assert db_state(seeded_db) == before


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("nightly report", id="space"),
        pytest.param("Nightly", id="uppercase"),
        pytest.param("a" * 201, id="201-chars"),
        pytest.param("", id="empty"),
        pytest.param("a/b", id="slash"),
        pytest.param("café", id="non-ascii"),
    ],
)
def test_bad_name_is_refused(seeded_db: Path, name: str) -> None:
    before = db_state(seeded_db)
    # `--` so a name that looks like an option still reaches the name check
    result = run_cli("schedule", "add", *ADD_OK, "--", name, db=seeded_db)
    assert_clean_error(result, 2, "name")
    assert db_state(seeded_db) == before


def test_name_of_exactly_200_chars_is_accepted(seeded_db: Path) -> None:
    name = "a" * 200
    assert add(seeded_db, name, *ADD_OK).code == 0
    assert cli_json("schedule", "show", name, db=seeded_db)["name"] == name


def test_bad_tenant_is_refused(seeded_db: Path) -> None:
    before = db_state(seeded_db)
    result = add(seeded_db, "fresh-job", *ADD_OK, "--tenant", "Team A")
    assert_clean_error(result, 2, "tenant")
    assert db_state(seeded_db) == before


def test_duplicate_name_is_a_conflict_and_leaves_the_first_unchanged(seeded_db: Path) -> None:
    first = cli_json("schedule", "show", "heartbeat", db=seeded_db)
    before = db_state(seeded_db)
    result = add(seeded_db, "heartbeat", "--cron", "0 9 * * *", "--command", "echo")
    assert_clean_error(result, 5, "heartbeat", "already exists")
    assert db_state(seeded_db) == before
    assert cli_json("schedule", "show", "heartbeat", db=seeded_db) == first


def test_same_name_in_another_tenant_is_not_a_duplicate(seeded_db: Path) -> None:
    assert add(seeded_db, "heartbeat", *ADD_OK, "--tenant", "globex").code == 0


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        pytest.param("{to: ops}", ("payload", "not valid json"), id="not-json"),
        pytest.param("[1, 2]", ("payload", "object"), id="array"),
        pytest.param('"text"', ("payload", "object"), id="string"),
        pytest.param('{"n": NaN}', ("payload",), id="nan"),
        pytest.param(HUGE_PAYLOAD, ("payload", "64 kib"), id="over-64KiB"),
    ],
)
def test_bad_payload_is_refused(seeded_db: Path, payload: str, words: tuple[str, ...]) -> None:
    before = db_state(seeded_db)
    result = add(seeded_db, "fresh-job", *ADD_OK, "--payload", payload)
    assert_clean_error(result, 2, *words)
    assert db_state(seeded_db) == before


def test_bad_payload_under_json_prints_nothing_on_stdout(seeded_db: Path) -> None:
    result = add(seeded_db, "fresh-job", *ADD_OK, "--payload", "[]", "--json")
    assert_clean_error(result, 2, "payload")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        pytest.param(("--command", "noop"), ("exactly one", "--cron"), id="no-trigger"),
        pytest.param(
            ("--every", "1m", "--cron", "* * * * *", "--command", "noop"),
            ("exactly one", "--cron", "--every"),
            id="cron-and-every",
        ),
        pytest.param(
            ("--every", "1m", "--at", "2099-01-01T00:00:00Z", "--command", "noop"),
            ("exactly one", "--every", "--at"),
            id="every-and-at",
        ),
        pytest.param(
            ("--every", "1m", "--dst-repeated", "both", "--command", "noop"),
            ("--dst-repeated", "--cron"),
            id="dst-repeated-with-every",
        ),
        pytest.param(
            ("--at", "2099-01-01T00:00:00Z", "--dst-missing", "skip", "--command", "noop"),
            ("--dst-missing", "--cron"),
            id="dst-missing-with-at",
        ),
        pytest.param(
            ("--cron", "0 * * * *", "--start", "2099-01-01T00:00:00Z", "--command", "noop"),
            ("--start", "--every"),
            id="start-with-cron",
        ),
        pytest.param(
            ("--at", "2020-01-01T00:00:00Z", "--command", "noop"), ("past",), id="at-in-the-past"
        ),
        pytest.param(("--at", "next tuesday", "--command", "noop"), ("instant",), id="at-garbage"),
        pytest.param(
            ("--at", "2099-03-29T02:30:00", "--tz", "Europe/Berlin", "--command", "noop"),
            ("does not exist", "offset"),
            id="at-in-a-skipped-hour",
        ),
        pytest.param(("--every", "1m", "--command", "rm"), ("command", "rm"), id="unknown-command"),
        pytest.param((*ADD_OK, "--meta", "owner"), ("--meta", "key=value"), id="meta-no-equals"),
        pytest.param((*ADD_OK, "--meta", "=ops"), ("--meta", "key=value"), id="meta-no-key"),
        pytest.param((*ADD_OK, "--meta", "bad key=x"), ("metadata key",), id="meta-bad-key"),
        pytest.param((*ADD_OK, "--jitter", "2h"), ("jitter", "1h"), id="jitter-over-1h"),
        pytest.param((*ADD_OK, "--jitter", "1h1s"), ("jitter", "1h"), id="jitter-just-over-1h"),
        pytest.param((*ADD_OK, "--jitter", "-1s"), ("jitter",), id="jitter-negative"),
        pytest.param(
            (*ADD_OK, "--catch-up-cap", "5"), ("--catch-up-cap", "each"), id="cap-without-each"
        ),
        pytest.param(
            (*ADD_OK, "--misfire", "each", "--catch-up-cap", "0"),
            ("catch-up cap",),
            id="cap-zero",
        ),
        pytest.param(
            (*ADD_OK, "--misfire", "each", "--catch-up-cap", "10001"),
            ("catch-up cap",),
            id="cap-over-10000",
        ),
        pytest.param(
            (*ADD_OK, "--max-catch-up-age", "0"), ("catch-up age",), id="max-catch-up-age-zero"
        ),
        pytest.param((*ADD_OK, "--misfire-grace", "soon"), ("misfire grace",), id="grace-garbage"),
    ],
)
def test_bad_option_is_refused(
    seeded_db: Path, options: tuple[str, ...], words: tuple[str, ...]
) -> None:
    before = db_state(seeded_db)
    result = add(seeded_db, "fresh-job", *options)
    assert_clean_error(result, 2, *words)
    assert db_state(seeded_db) == before


@pytest.mark.parametrize(
    ("args", "option"),
    [
        pytest.param(
            ("schedule", "add", "fresh-job", *ADD_OK, "--misfire", "sometimes"),
            "--misfire",
            id="misfire-not-a-choice",
        ),
        pytest.param(
            ("schedule", "add", "fresh-job", *ADD_OK, "--misfire", "each", "--catch-up-cap", "x"),
            "--catch-up-cap",
            id="cap-not-a-number",
        ),
        pytest.param(
            ("schedule", "add", "fresh-job", "--every", "1m"), "--command", id="command-missing"
        ),
        pytest.param(("schedule", "preview", "heartbeat", "--count", "0"), "--count", id="count-0"),
        pytest.param(("runs", "list", "--state", "exploded"), "--state", id="state-not-a-choice"),
    ],
)
def test_option_level_problem_is_a_usage_error(
    seeded_db: Path, args: tuple[str, ...], option: str
) -> None:
    before = db_state(seeded_db)
    assert_usage_error(run_cli(*args, db=seeded_db), option)
    assert db_state(seeded_db) == before


# -- a rejected change on a path with no database leaves no file behind ----------------------------


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(("--cron", "61 * * * *", "--command", "noop"), id="malformed-cron"),
        pytest.param(("--every", "1m", "--tz", "Mars/Olympus", "--command", "noop"), id="zone"),
        pytest.param(("--every", "1m", "--command", "rm"), id="unknown-command"),
    ],
)
def test_rejected_add_creates_no_database(tmp_path: Path, options: tuple[str, ...]) -> None:
    db = tmp_path / "vortos.db"
    result = add(db, "fresh-job", *options)
    assert_clean_error(result, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb", ["pause", "resume", "delete"])
def test_change_to_a_missing_schedule_on_a_path_with_no_database_creates_no_file(
    tmp_path: Path, verb: str
) -> None:
    result = run_cli("schedule", verb, "nosuch", db=tmp_path / "vortos.db")
    assert result.code in (1, 3), result.stderr
    assert_clean_error(result, result.code)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- names that do not exist ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("schedule", "show", "nosuch"), id="show"),
        pytest.param(("schedule", "preview", "nosuch"), id="preview"),
        pytest.param(("schedule", "pause", "nosuch"), id="pause"),
        pytest.param(("schedule", "resume", "nosuch"), id="resume"),
        pytest.param(("schedule", "delete", "nosuch"), id="delete"),
        pytest.param(("schedule", "show", "heartbeat", "--tenant", "globex"), id="other-tenant"),
        pytest.param(("runs", "list", "--schedule", "nosuch"), id="runs-of-unknown-schedule"),
    ],
)
def test_unknown_schedule_is_not_found(seeded_db: Path, args: tuple[str, ...]) -> None:
    before = db_state(seeded_db)
    assert_clean_error(run_cli(*args, db=seeded_db), 3, "no schedule named")
    assert db_state(seeded_db) == before


def test_show_nosuch_under_json_prints_nothing_on_stdout(seeded_db: Path) -> None:
    assert_clean_error(run_cli("schedule", "show", "nosuch", "--json", db=seeded_db), 3, "nosuch")


def test_pause_note_over_1000_chars_is_refused(seeded_db: Path) -> None:
    before = db_state(seeded_db)
    result = run_cli("schedule", "pause", "heartbeat", "--note", "n" * 1001, db=seeded_db)
    assert_clean_error(result, 2, "note")
    assert db_state(seeded_db) == before


def test_runs_since_garbage_is_invalid_input(seeded_db: Path) -> None:
    result = run_cli("runs", "list", "--since", "garbage", db=seeded_db)
    assert_clean_error(result, 2, "garbage", "instant")


# -- reading where there is no database -----------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("schedule", "list"), id="schedule-list"),
        pytest.param(("schedule", "list", "--json"), id="schedule-list-json"),
        pytest.param(("db", "info"), id="db-info"),
    ],
)
def test_reading_a_path_with_no_database_is_an_error_and_creates_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    db = tmp_path / "vortos.db"
    assert_clean_error(run_cli(*args, db=db), 1, "no database", "db init")
    assert list(tmp_path.iterdir()) == []


def test_parent_directory_missing_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "missing" / "vortos.db"
    assert_clean_error(add(db, "fresh-job", *ADD_OK), 1, "does not exist")
    assert list(tmp_path.iterdir()) == []


# -- the daemon refuses bad options before touching anything --------------------------------------


@pytest.mark.parametrize(
    ("options", "words"),
    [
        pytest.param(("--lease-ttl", "abc"), ("lease ttl", "duration"), id="ttl-garbage"),
        pytest.param(("--lease-ttl", "0"), ("lease ttl", "1s"), id="ttl-zero"),
        pytest.param(("--log-level", "loud"), ("log level",), id="log-level"),
        pytest.param(("--node-id", "x" * 201), ("--node-id",), id="node-id-too-long"),
    ],
)
def test_run_with_bad_option_exits_2_before_touching_anything(
    tmp_path: Path, options: tuple[str, ...], words: tuple[str, ...]
) -> None:
    db = tmp_path / "vortos.db"
    assert_clean_error(run_cli("run", *options, db=db, timeout=20), 2, *words)
    assert list(tmp_path.iterdir()) == []


def test_run_with_bad_option_leaves_an_existing_database_unchanged(seeded_db: Path) -> None:
    before = db_state(seeded_db)
    assert_clean_error(run_cli("run", "--lease-ttl", "0", db=seeded_db, timeout=20), 2, "lease")
    assert db_state(seeded_db) == before


def test_run_help_exits_0_without_touching_anything(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    result = run_cli("run", "--help", db=db)
    assert result.code == 0
    assert "--lease-ttl" in result.stdout
    assert list(tmp_path.iterdir()) == []


# -- --db pointing at something that is not a Vortos database --------------------------------------

DB_COMMANDS = [
    pytest.param(("schedule", "add", "fresh-job", *ADD_OK), id="add"),
    pytest.param(("schedule", "list"), id="list"),
    pytest.param(("db", "init"), id="db-init"),
]


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("args", DB_COMMANDS)
def test_db_pointing_at_a_directory_is_refused(tmp_path: Path, args: tuple[str, ...]) -> None:
    directory = tmp_path / "data"
    directory.mkdir()
    (directory / "keep.txt").write_text("mine\n")
    assert_clean_error(run_cli(*args, db=directory), 1, "directory")
    assert files_in(directory) == ["keep.txt"]
    assert files_in(tmp_path) == ["data"]


@pytest.mark.parametrize("args", DB_COMMANDS)
def test_db_pointing_at_a_text_file_is_refused_and_the_file_is_unchanged(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    text = tmp_path / "notes.txt"
    content = b"shopping list\n- milk\n- eggs\n"
    text.write_bytes(content)
    assert_clean_error(run_cli(*args, db=text), 1, "not a sqlite database")
    assert text.read_bytes() == content
    assert files_in(tmp_path) == ["notes.txt"]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("schedule", "add", "fresh-job", *ADD_OK), id="add"),
        pytest.param(("db", "init"), id="db-init"),
    ],
)
def test_an_empty_file_is_initialised_by_a_writing_command(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    # What `touch vortos.db` leaves: SQLite itself treats a zero-byte file as an empty database.
    db = tmp_path / "vortos.db"
    db.touch()
    result = run_cli(*args, db=db)
    assert result.code == 0, result.stderr
    assert db_state(db).user_version >= 1


def test_an_empty_file_is_a_clear_error_for_a_reading_command(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    db.touch()
    assert_clean_error(run_cli("schedule", "list", db=db), 1, "empty", "db init")
    assert db.read_bytes() == b""


def make_foreign_database(path: Path) -> None:
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA application_id = 1234567")
        conn.execute("PRAGMA user_version = 7")
        conn.execute("CREATE TABLE recipes (id INTEGER PRIMARY KEY, title TEXT NOT NULL)")
        conn.execute("INSERT INTO recipes (title) VALUES ('bread'), ('soup')")


@pytest.mark.parametrize("args", DB_COMMANDS)
def test_db_pointing_at_another_applications_sqlite_file_is_refused_untouched(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    foreign = tmp_path / "recipes.db"
    make_foreign_database(foreign)
    before_bytes = foreign.read_bytes()
    before = db_state(foreign)
    assert_clean_error(run_cli(*args, db=foreign), 1, "another application")
    assert foreign.read_bytes() == before_bytes
    assert db_state(foreign) == before
    assert before.application_id == 1234567
    assert files_in(tmp_path) == ["recipes.db"]


@pytest.mark.parametrize("args", DB_COMMANDS[:2])
def test_db_pointing_at_a_foreign_file_with_tables_but_no_application_id_is_refused(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    foreign = tmp_path / "app.db"
    with closing(sqlite3.connect(foreign, isolation_level=None)) as conn:
        conn.execute("CREATE TABLE schedules (id INTEGER PRIMARY KEY, cron TEXT)")
    before_bytes = foreign.read_bytes()
    assert_clean_error(run_cli(*args, db=foreign), 1, "another application")
    assert foreign.read_bytes() == before_bytes


@pytest.mark.parametrize("args", DB_COMMANDS[:2])
def test_db_pointing_at_a_corrupt_file_is_refused_untouched(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    corrupt = tmp_path / "vortos.db"
    content = b"SQLite format 3\x00" + bytes(range(256)) * 32
    corrupt.write_bytes(content)
    assert_clean_error(run_cli(*args, db=corrupt), 1, str(corrupt))
    assert corrupt.read_bytes() == content
    assert files_in(tmp_path) == ["vortos.db"]


@pytest.mark.parametrize("args", DB_COMMANDS[:2])
def test_db_with_a_newer_schema_is_refused_untouched(
    seeded_db: Path, args: tuple[str, ...]
) -> None:
    with closing(sqlite3.connect(seeded_db, isolation_level=None)) as conn:
        conn.execute("PRAGMA user_version = 99")
    checkpoint(seeded_db)
    before = db_state(seeded_db)
    assert_clean_error(run_cli(*args, db=seeded_db), 1, "newer", "upgrade vortos")
    assert db_state(seeded_db) == before


def test_db_locked_by_another_process_is_a_clear_error(seeded_db: Path) -> None:
    before = db_state(seeded_db)
    with closing(sqlite3.connect(seeded_db, isolation_level=None, timeout=0)) as holder:
        holder.execute("BEGIN EXCLUSIVE")
        try:
            result = add(seeded_db, "fresh-job", *ADD_OK)
        finally:
            holder.execute("ROLLBACK")
    assert_clean_error(result, 1, "locked")
    assert db_state(seeded_db) == before


# -- --db at a read-only location ------------------------------------------------------------------


@dataclass(frozen=True)
class ReadOnlyPlace:
    """A directory this test can fill but the CLI, run through `prefix`, cannot write to."""

    directory: Path
    prefix: tuple[str, ...]
    how: str

    def run(self, *args: str, db: Path) -> CliResult:
        done = subprocess.run(
            [*self.prefix, sys.executable, "-m", "vortos_tui.cli", "--db", str(db), *args],
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=60,
            check=False,
        )
        return CliResult(done.returncode, done.stdout, done.stderr)


PROBE = """
import os, sys
import vortos_tui.cli
directory = sys.argv[1]
assert os.path.isdir(directory) and os.access(directory, os.X_OK)
try:
    open(os.path.join(directory, "probe"), "w")
except PermissionError:
    sys.exit(0)
sys.exit(3)
"""


def can_use(prefix: tuple[str, ...], directory: Path) -> bool:
    """The CLI's interpreter runs under `prefix`, sees `directory`, and cannot write into it."""
    done = subprocess.run(
        [*prefix, sys.executable, "-c", PROBE, str(directory)],
        capture_output=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )
    return done.returncode == 0


def root_strategies(base: Path) -> Iterator[ReadOnlyPlace]:
    """As root, chmod alone stops nothing: run the CLI as someone the directory refuses.

    First as `nobody` against a root-owned 0755 directory. Where `nobody` cannot run this
    interpreter (it lives under /root here), stay root but drop every capability, so root is held
    to the permission bits like anyone else, against a directory owned by `nobody`.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return
    as_nobody = base / "as-nobody"
    as_nobody.mkdir(mode=0o755)
    as_nobody.chmod(0o755)
    yield ReadOnlyPlace(
        as_nobody,
        (setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"),
        "as nobody",
    )
    capless = base / "capless"
    capless.mkdir(mode=0o755)
    capless.chmod(0o755)
    os.chown(capless, NOBODY, NOBODY)
    yield ReadOnlyPlace(
        capless,
        (setpriv, "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs"),
        "as root without capabilities",
    )


@pytest.fixture
def read_only_place(tmp_path: Path) -> Iterator[ReadOnlyPlace]:
    # Not under tmp_path: pytest's base directory is 0700, which would stop `nobody` earlier.
    base = Path(tempfile.mkdtemp(prefix="vortos-ro-"))
    base.chmod(0o755)
    try:
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("running as root and setpriv is absent: cannot make a read-only place")
            for place in root_strategies(base):
                if can_use(place.prefix, place.directory):
                    yield place
                    return
            pytest.skip("as root, neither `nobody` nor a capability-less root could be used")
        directory = base / "read-only"
        directory.mkdir()
        directory.chmod(0o555)
        if not can_use((), directory):
            pytest.skip("chmod 0555 does not stop writes here")
        yield ReadOnlyPlace(directory, (), "chmod 0555")
    finally:
        for path in base.rglob("*"):
            if path.is_dir():
                path.chmod(stat.S_IRWXU)
        shutil.rmtree(base)


def place_file(place: ReadOnlyPlace, source: Path, name: str) -> Path:
    """Copy a database into the read-only place, owned like the place, mode 0644."""
    target = place.directory / name
    if os.geteuid() == 0:
        copy_database(source, target)
        owner = place.directory.stat()
        os.chown(target, owner.st_uid, owner.st_gid)
    else:
        place.directory.chmod(0o755)
        copy_database(source, target)
        place.directory.chmod(0o555)
    target.chmod(0o644)
    return target


def test_add_creating_a_database_in_a_read_only_place_is_refused(
    read_only_place: ReadOnlyPlace,
) -> None:
    db = read_only_place.directory / "vortos.db"
    result = read_only_place.run("schedule", "add", "fresh-job", *ADD_OK, db=db)
    line = assert_clean_error(result, 1, str(db))
    assert "writable" in line or "read-only" in line, (read_only_place.how, line)
    assert files_in(read_only_place.directory) == []


def test_db_init_in_a_read_only_place_is_refused(read_only_place: ReadOnlyPlace) -> None:
    db = read_only_place.directory / "vortos.db"
    line = assert_clean_error(read_only_place.run("db", "init", db=db), 1, str(db))
    assert "writable" in line or "read-only" in line, (read_only_place.how, line)
    assert files_in(read_only_place.directory) == []


def test_add_to_an_existing_database_in_a_read_only_place_is_refused_untouched(
    read_only_place: ReadOnlyPlace, seed_template: Path
) -> None:
    db = place_file(read_only_place, seed_template, "vortos.db")
    content = db.read_bytes()
    files = files_in(read_only_place.directory)  # the database and its audit key
    result = read_only_place.run("schedule", "add", "fresh-job", *ADD_OK, db=db)
    line = assert_clean_error(result, 1, str(db))
    assert "writable" in line or "read-only" in line, (read_only_place.how, line)
    assert db.read_bytes() == content
    assert files_in(read_only_place.directory) == files
