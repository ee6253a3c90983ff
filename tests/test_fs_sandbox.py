"""The filesystems check under the shipped unit's sandbox (deployment issue, item 1).

`ProtectSystem=strict` gives medic-healthd a mount namespace in which every mount not in
`ReadWritePaths=` is read-only. The check must report what the host sees, not what its
sandbox sees, or every node drains for an unwritable scratch. The sandbox here is built from
the unit file itself (a private mount namespace, `unshare`, with each mount the unit would
protect remounted read-only), so it cannot drift from what ships.

Under systemd, PID 1 is in the host's mount namespace and root may look through it. This
machine's PID 1 does not let the tests look through it, so a process started in the host's
namespace stands in for it: the check runs on a root whose proc/1 is that process."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess  # noqa: TID251  (Popen: a process that waits in the host's namespace)
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.lab.production import setpriv_argv
from medic_core import proc

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "medic-healthd.service"

PROBE = """
import json, sys
from pathlib import Path
from typing import Any
from healthd.checks.base import CheckContext
from healthd.checks.filesystems import FilesystemsCheck, FilesystemsConfig
root, point = Path(sys.argv[1]), sys.argv[2]
check = FilesystemsCheck()
cfg = FilesystemsConfig(required_mounts=(point,))
results = check.evaluate(check.gather(CheckContext.for_root(root), cfg), cfg)
print(json.dumps([[str(r.status), r.fault_class, r.message] for r in results]))
"""


def unit_settings(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            found.setdefault(key.strip(), []).extend(value.split())
    return found


def protected_by_the_unit(point: Path) -> bool:
    """Whether the unit's ProtectSystem=strict makes `point` read-only in its sandbox."""
    unit = unit_settings(UNIT)
    if unit.get("ProtectSystem") != ["strict"]:
        return False
    writable = [Path(p.lstrip("-")) for p in unit.get("ReadWritePaths", [])]
    return not any(point == w or w in point.parents for w in writable)


def can_sandbox() -> str:
    if os.geteuid() != 0:
        return "needs root (mount namespaces and tmpfs)"
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return "needs unshare and setpriv (util-linux)"
    return ""


pytestmark = pytest.mark.skipif(bool(can_sandbox()), reason=can_sandbox() or "ok")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A writable tmpfs on the host, as a site's /scratch would be."""
    point = Path(f"/tmp/medic-scratch-{os.getpid()}")
    point.mkdir()
    mounted = proc.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)], timeout=10)
    try:
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
        yield point
    finally:
        proc.run(["umount", "-l", str(point)], timeout=10)
        point.rmdir()


@pytest.fixture
def host_root(tmp_path: Path) -> Iterator[Path]:
    """A root whose proc/1 is a process waiting in the host's mount namespace."""
    stand_in = subprocess.Popen(["sleep", "300"])
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "1").symlink_to(f"/proc/{stand_in.pid}")
    try:
        yield root
    finally:
        stand_in.kill()
        stand_in.wait(timeout=10)


def run_in_the_units_sandbox(root: Path, point: Path) -> list[list[Any]]:
    """The check's results, run in a private mount namespace where `point` is what the
    unit's sandbox makes it (read-only, unless ReadWritePaths= lists it)."""
    remount = (
        f"mount -o remount,bind,ro {point} {point} && " if protected_by_the_unit(point) else ""
    )
    # ...and with only the unit's capabilities (CapabilityBoundingSet=): looking through
    # /proc/1/root takes CAP_SYS_PTRACE, writing a probe into others' directories more.
    probe = shlex.join([*setpriv_argv(UNIT), sys.executable, "-c", PROBE, str(root), str(point)])
    done = proc.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", remount + probe],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def test_the_unit_protects_a_site_mount_like_scratch(scratch: Path) -> None:
    """The premise: without the host view, this mount is read-only for the daemon."""
    assert protected_by_the_unit(scratch)
    inside = proc.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount -o remount,bind,ro {scratch} {scratch} && touch {scratch}/x"],
        timeout=30,
    )  # fmt: skip
    assert inside.returncode != 0 and "Read-only" in inside.stderr, inside.stderr


def test_a_writable_host_mount_is_ok_from_inside_the_units_sandbox(
    scratch: Path, host_root: Path
) -> None:
    [(status, fault_class, message)] = run_in_the_units_sandbox(host_root, scratch)
    assert (status, fault_class) == ("OK", None), message
    assert list(scratch.iterdir()) == []  # the probe's file is gone


def test_a_host_mount_that_is_read_only_is_still_reported(scratch: Path, host_root: Path) -> None:
    assert proc.run(["mount", "-o", "remount,ro", str(scratch)], timeout=10).returncode == 0
    [(status, fault_class, message)] = run_in_the_units_sandbox(host_root, scratch)
    assert (status, fault_class) == ("CRITICAL", "fs.unwritable"), message
    assert "mounted read-only" in message
