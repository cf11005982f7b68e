"""Run the `vortos` CLI as another Unix account: `python -m tests.integration.as_account USER
-- ARGS...` (as root).

The interpreter lives under /root here, which other accounts cannot enter, so it cannot be
exec'd as them (what `subprocess.run(user=...)` does). Instead this process starts as root,
imports everything the CLI needs, then drops to USER's uid, gid and groups for good, and only
then runs the command: every file it opens and every socket it connects to is opened as USER,
and the kernel reports USER's uid to the other end.
"""

from __future__ import annotations

import contextlib
import grp
import importlib
import os
import pkgutil
import pwd
import sys
from types import ModuleType

import pydantic
import pydantic_core
import rich
import typer

import engine
import vortos_tui.cli
from vortos_tui.cli import app as vortos

# Modules that libraries import lazily, on first use.
LAZY_STDLIB = ("gettext", "shutil", "locale", "textwrap", "difflib", "unicodedata", "getpass")


def preload(*packages: ModuleType) -> None:
    """Import every module of these packages while their files are still readable."""
    for name in LAZY_STDLIB:
        importlib.import_module(name)
    for package in packages:
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if module.name.endswith("__main__"):
                continue  # importing one runs its program
            # Optional parts (rich's Jupyter support, ...) may need what is not installed.
            with contextlib.suppress(Exception):
                importlib.import_module(module.name)


def become(user: str) -> None:
    account = pwd.getpwnam(user)
    groups = [g.gr_gid for g in grp.getgrall() if user in g.gr_mem]
    os.setgroups(sorted({account.pw_gid, *groups}))
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    if os.getuid() != account.pw_uid or os.geteuid() != account.pw_uid:
        raise SystemExit("could not drop to the account")
    os.chdir("/")


def main() -> None:
    user, sep, *args = sys.argv[1:]
    if sep != "--":
        raise SystemExit("usage: as_account USER -- ARGS...")
    preload(typer, rich, pydantic, pydantic_core, engine, vortos_tui.cli)
    become(user)
    sys.argv = ["vortos", *args]
    vortos(prog_name="vortos")


if __name__ == "__main__":
    main()
