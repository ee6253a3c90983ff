"""The production lab's sandbox for a daemon in a Debian root (cli/lab/production.py, run
inside the root): `unshare --mount --propagation private` needs `/` to be a mount point,
which a plain directory entered with `unshare --root` is not ("cannot change root
filesystem propagation: Invalid argument", measured on 24.11 and 26.05). The root is
therefore mounted on itself, private, before anything is mounted in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.lab import debian_root
from cli.lab.debian_root import DebianRoot
from cli.lab.production import SANDBOX_SCRIPT


def test_the_root_is_mounted_on_itself_first_and_private(tmp_path: Path) -> None:
    root = DebianRoot.for_release("24.11", cache=tmp_path)
    mounts = root._mounts()
    target, argv = mounts[0]
    assert target == root.path
    assert argv == ["mount", "--bind", "--make-private", str(root.path), str(root.path)]
    # Everything else is mounted inside it, after it (a bind would hide what was there).
    assert all(str(t).startswith(f"{root.path}/") for t, _ in mounts[1:])


def test_the_roots_own_mount_is_left_until_down_and_then_unmounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = DebianRoot.for_release("24.11", cache=tmp_path)
    table = ["/", str(root.path), f"{root.path}/proc", f"{root.path}-other", "/tmp"]
    monkeypatch.setattr(debian_root, "_mount_points", lambda: list(table))
    assert root.mounts_left() == [str(root.path), f"{root.path}/proc"]
    gone: list[str] = []

    def umount(target: Path) -> None:
        gone.append(str(target))
        table.remove(str(target))

    monkeypatch.setattr(debian_root, "_umount", umount)
    root._unmount_all()
    assert gone == [f"{root.path}/proc", str(root.path)]  # deepest first, the root last
    assert root.mounts_left() == []


def test_the_sandbox_makes_a_roots_shared_mounts_read_only_too() -> None:
    # /tmp, /var/tmp and the repository are the host's, bound into the root: without this
    # the daemon could write anywhere under them (cli/lab/cluster.py sets the list).
    assert 'for m in $MEDIC_LAB_READONLY; do mount -o remount,bind,ro "$m"; done' in SANDBOX_SCRIPT
    lines = SANDBOX_SCRIPT.splitlines()
    ro = lines.index("mount -o remount,bind,ro /")
    assert lines[ro + 1].startswith("for m in $MEDIC_LAB_READONLY") and lines[-1] == 'exec "$@"'
