"""A user (not root) running medic against the node's root-only store is told why in one
line, not SQLite's "unable to open database file" (hardening issue, item 6's follow-up)."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from medic_core import proc
from medic_core.store import open_store
from tests.installed import installed_medic

OPEN = """
import sys
from medic_core.store import StoreError, open_store
try:
    open_store(sys.argv[1]).close()
except StoreError as exc:
    print(exc)
    raise SystemExit(1)
print("opened")
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes a root-only store")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A root-only state directory like /var/lib/medic, below one a user may traverse."""
    top = Path(tempfile.mkdtemp(prefix="medic-perm-"))
    top.chmod(0o711)
    state = top / "state"
    state.mkdir(mode=0o700)
    try:
        yield state
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_nobody(url: str) -> proc.CommandResult:
    """medic_core.store opened by `nobody`, from the installed wheel (tests/installed.py)."""
    nobody = pwd.getpwnam("nobody")
    return proc.run(
        ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
         "--", str(installed_medic().python), "-I", "-c", OPEN, url],
        timeout=60,
    )  # fmt: skip


def test_a_user_is_told_the_store_is_roots_only(state_dir: Path) -> None:
    url = f"sqlite:///{state_dir / 'medic.db'}"
    open_store(url).close()  # root made it
    done = as_nobody(url)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stdout.splitlines()
    assert "permission denied for uid" in line and "run medic as root" in line, line
    assert "unable to open database file" not in line


def test_a_store_the_user_may_open_opens(state_dir: Path) -> None:
    state_dir.chmod(0o777)
    url = f"sqlite:///{state_dir / 'medic.db'}"
    done = as_nobody(url)
    assert (done.returncode, done.stdout.strip()) == (0, "opened"), done.stderr
