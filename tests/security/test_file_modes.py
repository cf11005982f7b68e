"""Files are private whatever the umask (finding 6, acceptance 3): every file Vortos creates
(the SQLite database, its -wal/-shm, the audit key, `audit export -o`) is 0600, or 0640 and
the control group's in the shared-read layout, and nothing is written through a symlink or
over an existing file by accident. Real processes under umask 022, real Unix accounts.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw
import pytest

from tests.security.deployment import ROOT, Accounts, Deployment

UMASK = 0o022


def vortos(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as root under umask 022 (the usual default that made every file 0644)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("VORTOS_")}
    return subprocess.run(
        [sys.executable, "-m", "vortos_tui.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env=environment | (env or {}),
        umask=UMASK,
    )


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def wal_open(db: Path) -> Iterator[None]:
    """Hold the database open mid-write, so its -wal and -shm exist (SQLite makes them)."""
    previous = os.umask(UMASK)
    conn = apsw.Connection(str(db))
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TEMP TABLE t(x)")
        conn.execute("PRAGMA user_version")  # the write lock and the shared memory are taken
        conn.execute("UPDATE schedules SET version = version WHERE 0")
        conn.execute("COMMIT")
        assert Path(f"{db}-wal").exists()
        assert Path(f"{db}-shm").exists()
        yield
    finally:
        conn.close()
        os.umask(previous)


@pytest.fixture
def place() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="vt-modes-", dir="/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def made(base: Path, env: dict[str, str] | None = None) -> Path:
    """A new database with an audited change and an export, made by the CLI under umask 022."""
    db = base / "vortos.db"
    added = vortos(
        "--db", str(db), "schedule", "add", "job", "--every", "1h", "--command", "noop", env=env
    )
    assert added.returncode == 0, added.stderr
    exported = vortos("--db", str(db), "audit", "export", "-o", str(base / "audit.jsonl"), env=env)
    assert exported.returncode == 0, exported.stderr
    return db


def test_new_files_are_0600_under_umask_022(place: Path) -> None:
    """The promise: a payload's token or the audit key is never readable by others."""
    db = made(place)
    with wal_open(db):
        for name in (
            "vortos.db",
            "vortos.db-wal",
            "vortos.db-shm",
            "vortos.db.audit-key",
            "audit.jsonl",
        ):
            assert mode_of(place / name) == 0o600, name


def test_with_a_control_group_the_database_files_are_0640_and_the_groups(
    place: Path, ops: Accounts
) -> None:
    """The shared-read layout: operators may read the database, never the key."""
    db = made(place, env={"VORTOS_CONTROL_GROUP": ops.group})
    with wal_open(db):
        for name in ("vortos.db", "vortos.db-wal", "vortos.db-shm", "audit.jsonl"):
            assert mode_of(place / name) == 0o640, name
            assert (place / name).stat().st_gid == ops.gid, name
    assert mode_of(place / "vortos.db.audit-key") == 0o600


def test_operator_file_access_none_keeps_every_file_0600_even_with_a_control_group(
    place: Path, ops: Accounts
) -> None:
    env = {"VORTOS_CONTROL_GROUP": ops.group, "VORTOS_OPERATOR_FILE_ACCESS": "none"}
    db = made(place, env=env)
    with wal_open(db):
        for name in (
            "vortos.db",
            "vortos.db-wal",
            "vortos.db-shm",
            "vortos.db.audit-key",
            "audit.jsonl",
        ):
            assert mode_of(place / name) == 0o600, name


def test_a_bad_operator_file_access_is_refused_by_name() -> None:
    result = vortos("config", "show", env={"VORTOS_OPERATOR_FILE_ACCESS": "all"})
    assert result.returncode == 2
    assert "VORTOS_OPERATOR_FILE_ACCESS='all' is refused" in result.stderr
    assert "one of read, none" in result.stderr


def test_an_export_never_overwrites_an_existing_file_unless_forced(place: Path) -> None:
    db = made(place)
    target = place / "audit.jsonl"
    target.write_text("kept\n")
    again = vortos("--db", str(db), "audit", "export", "-o", str(target))
    assert again.returncode == 5
    assert "exists" in again.stderr
    assert "--force" in again.stderr
    assert target.read_text() == "kept\n"
    forced = vortos("--db", str(db), "audit", "export", "-o", str(target), "--force")
    assert forced.returncode == 0, forced.stderr
    assert target.read_text().startswith("{")
    assert mode_of(target) == 0o600
    assert [p.name for p in place.iterdir() if p.name.endswith(".tmp")] == []


def test_an_export_onto_a_symlink_never_writes_where_it_points(place: Path) -> None:
    """A link planted in a shared directory must not make root's export overwrite its target."""
    db = made(place)
    victim = place / "victim"
    victim.write_text("precious\n")
    link = place / "planted.jsonl"
    link.symlink_to(victim)
    refused = vortos("--db", str(db), "audit", "export", "-o", str(link))
    assert refused.returncode == 5, refused.stderr
    forced = vortos("--db", str(db), "audit", "export", "-o", str(link), "--force")
    assert forced.returncode == 0, forced.stderr
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink()
    assert link.read_text().startswith("{")


def test_doctor_names_a_loose_file_and_run_tightens_it(place: Path, ops: Accounts) -> None:
    """An existing world-readable database (made under an old umask) is found and fixed."""
    db = made(place)
    db.chmod(0o644)
    (place / "vortos.db.audit-key").chmod(0o644)
    before = vortos("--db", str(db), "doctor", "--json")
    finding = next(
        f for f in json.loads(before.stdout)["findings"] if f["check_id"] == "storage.file_modes"
    )
    assert finding["status"] == "fail"
    assert f"{db} is 0644" in finding["detail"]
    assert f"chmod 0600 {db}" in finding["remediation"]
    site = Deployment(ops, place, db, place / "control.sock", place / "server.log")
    site.start(env={"VORTOS_DB": str(db)})
    try:
        assert mode_of(db) == 0o640
        assert db.stat().st_gid == ops.gid
        assert mode_of(place / "vortos.db.audit-key") == 0o600
        said = site.log.read_text()
        assert f"made {db} private: it was 0644, it is now 0640" in said
    finally:
        site.stop()
    after = vortos("--db", str(db), "doctor", "--json", env={"VORTOS_CONTROL_GROUP": ops.group})
    finding = next(
        f for f in json.loads(after.stdout)["findings"] if f["check_id"] == "storage.file_modes"
    )
    assert finding["status"] == "pass", finding


# -- acceptance 3: the README's systemd layout, followed literally under umask 022 --------------

PROBE = """
import json, sys
from tests.integration.as_account import become
user, *paths = sys.argv[1:]
become(user)
found = {}
for path in paths:
    try:
        with open(path, "rb") as handle:
            handle.read(1)
        found[path] = "read"
    except OSError as exc:
        found[path] = type(exc).__name__
print(json.dumps(found))
"""


def readable_by(user: str, paths: list[Path]) -> dict[str, str]:
    """Which of `paths` `user` can open and read (run as that account, nothing more)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, user, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
    )
    found: dict[str, str] = json.loads(done.stdout)
    return found


@contextmanager
def readme_layout(ops: Accounts, access: str) -> Iterator[Deployment]:
    """StateDirectory=vortos (0750, the service's group), UMask 022 instead of 0027, and the
    service (root here) creating its own database and key under it."""
    base = Path(tempfile.mkdtemp(prefix="vt-layout-", dir="/tmp"))
    os.chown(base, 0, ops.gid)
    base.chmod(0o750)
    site = Deployment(ops, base, base / "vortos.db", base / "control.sock", base / "server.log")
    previous = os.umask(UMASK)
    try:
        site.start(env={"VORTOS_OPERATOR_FILE_ACCESS": access})
        added = site.as_account(
            ops.alice, "schedule", "add", "job", "--every", "1h", "--command", "noop"
        )
        # alice has no role yet: refused or made, either way the service wrote the database.
        assert added.returncode in (0, 4), added.stderr
        yield site
    finally:
        os.umask(previous)
        site.stop()
        shutil.rmtree(base, ignore_errors=True)


def files_of(site: Deployment) -> list[Path]:
    found = [p for p in site.base.iterdir() if p.is_file() and p != site.log]
    names = {p.name for p in found}
    assert {"vortos.db", "vortos.db-wal", "vortos.db-shm", "vortos.db.audit-key"} <= names, names
    return found


@pytest.mark.parametrize("access", ["read", "none"])
def test_no_file_of_the_readme_layout_is_readable_outside_the_service_and_its_group(
    ops: Accounts, access: str
) -> None:
    """Acceptance 3: an account outside the service and the control group reads nothing, not
    even with the directory opened to it (each file's own mode must hold)."""
    with readme_layout(ops, access) as site:
        files = files_of(site)
        for path in files:
            assert not mode_of(path) & 0o007, f"{path} is {mode_of(path):04o}"
        assert readable_by(ops.outsider, files) == {str(p): "PermissionError" for p in files}
        site.base.chmod(0o755)  # even an opened directory does not expose them
        assert set(readable_by(ops.outsider, files).values()) == {"PermissionError"}


def test_a_group_operator_reads_the_database_only_in_the_shared_read_layout(ops: Accounts) -> None:
    """`read`: the group reads the database files, never the key; `none`: nothing at all."""
    with readme_layout(ops, "read") as site:
        db_files = [site.db, Path(f"{site.db}-wal"), Path(f"{site.db}-shm")]
        key = Path(f"{site.db}.audit-key")
        found = readable_by(ops.bob, [*db_files, key])
        assert found == {**{str(p): "read" for p in db_files}, str(key): "PermissionError"}
    with readme_layout(ops, "none") as site:
        files = files_of(site)
        assert set(readable_by(ops.bob, files).values()) == {"PermissionError"}
        listed = site.as_account(ops.bob, "schedule", "list")
        assert listed.returncode in (0, 4), listed.stderr  # reads go through the socket
