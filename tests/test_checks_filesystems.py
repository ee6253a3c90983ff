"""The filesystems check: mount table, write probes, space, and hung mounts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.checks.base import CheckContext, Result, Status
from healthd.checks.filesystems import (
    FilesystemsCheck,
    FilesystemsConfig,
    FilesystemsObservation,
    MountEntry,
    MountProbe,
    parse_mounts,
)
from healthd.fixtures import write_host_tree
from healthd.hostfs import FsUsage, OsMountOps

REQUIRED = FilesystemsConfig(required_mounts=("/home", "/lustre", "/scratch"), mount_timeout=0.3)
ROOMY = FsUsage(total_bytes=10**12, avail_bytes=5 * 10**11, total_inodes=10**6, avail_inodes=10**5)
NFS = MountEntry("nfs01:/export/home", "/home", "nfs4", ("rw", "hard"))


class FakeMountOps:
    """Answers from a table; mounts listed in `hang` block until `release` is set."""

    def __init__(self, hang: set[str] | None = None, usage: FsUsage = ROOMY) -> None:
        self.hang = hang or set()
        self.release = threading.Event()
        self.usage_value = usage
        self.unwritable: dict[str, OSError] = {}
        self.calls: list[str] = []

    def usage(self, path: Path) -> FsUsage:
        self.calls.append(path.name)
        if path.name in self.hang:
            self.release.wait()
        return self.usage_value

    def write_probe(self, path: Path) -> None:
        if path.name in self.unwritable:
            raise self.unwritable[path.name]


@pytest.fixture
def host(tmp_path: Path) -> Path:
    write_host_tree(tmp_path)
    return tmp_path


@pytest.fixture
def fake() -> Iterator[FakeMountOps]:
    ops = FakeMountOps()
    yield ops
    ops.release.set()


def run(
    check: FilesystemsCheck, root: Path, ops: object, cfg: FilesystemsConfig = REQUIRED
) -> list[Result]:
    ctx = CheckContext.for_root(root, mounts=ops)
    return FilesystemsCheck.evaluate(check.gather(ctx, cfg), cfg)


def summary(results: list[Result]) -> list[tuple[Status, str | None, str | None]]:
    return [(r.status, r.fault_class, r.target) for r in results]


# --- evaluate (pure) ---


def evaluate(*probes: MountProbe, cfg: FilesystemsConfig | None = None) -> list[Result]:
    cfg = cfg or FilesystemsConfig(required_mounts=tuple(p.mount_point for p in probes))
    return FilesystemsCheck.evaluate(FilesystemsObservation(probes), cfg)


def test_nothing_required_is_not_applicable() -> None:
    assert evaluate(cfg=FilesystemsConfig())[0].status is Status.NOT_APPLICABLE


def test_missing_hung_and_failed_mounts() -> None:
    results = evaluate(
        MountProbe("/lustre", None),
        MountProbe("/home", NFS, hung_seconds=5.0),
        MountProbe("/scratch", NFS, error="OSError: [Errno 116] Stale file handle"),
    )
    assert summary(results) == [
        (Status.CRITICAL, "fs.missing", "/lustre"),
        (Status.CRITICAL, "fs.hung", "/home"),
        (Status.CRITICAL, "fs.error", "/scratch"),
    ]
    assert results[1].remediation == "drain"


@pytest.mark.parametrize(
    ("avail_percent", "expected"),
    [(50, Status.OK), (4, Status.WARN), (0.5, Status.CRITICAL)],
)
def test_free_space_thresholds(avail_percent: float, expected: Status) -> None:
    usage = FsUsage(10**12, int(10**10 * avail_percent), 0, 0)
    (result,) = evaluate(MountProbe("/home", NFS, usage, wrote=True))
    assert result.status is expected
    if expected is not Status.OK:
        assert result.fault_class == "fs.full" and result.remediation == "none"


def test_inodes_and_zero_inode_filesystems() -> None:
    usage = FsUsage(10**12, 5 * 10**11, 10**6, 10**3)
    (result,) = evaluate(MountProbe("/home", NFS, usage))
    assert (result.status, result.fault_class) == (Status.CRITICAL, "fs.inodes")
    no_inodes = FsUsage(10**12, 5 * 10**11, 0, 0)
    assert evaluate(MountProbe("/home", NFS, no_inodes))[0].status is Status.OK


def test_read_only_mount_is_unwritable_unless_expected() -> None:
    ro = MountEntry("nfs01:/apps", "/apps", "nfs4", ("ro", "hard"))
    (result,) = evaluate(MountProbe("/apps", ro, ROOMY))
    assert (result.status, result.fault_class) == (Status.CRITICAL, "fs.unwritable")
    cfg = FilesystemsConfig(required_mounts=("/apps",), read_only_mounts=("/apps",))
    assert evaluate(MountProbe("/apps", ro, ROOMY), cfg=cfg)[0].status is Status.OK


def test_parse_mounts_unescapes_and_keeps_the_top_mount() -> None:
    table = parse_mounts(
        "/dev/sda1 /data\\040set ext4 rw 0 0\ntmpfs /run tmpfs rw 0 0\ntmpfs /run tmpfs ro 0 0\n"
    )
    assert table["/data set"].device == "/dev/sda1"
    assert table["/run"].read_only


# --- gather on fixture trees ---


def test_fixture_tree_with_real_probes(host: Path) -> None:
    results = run(FilesystemsCheck(), host, OsMountOps())
    assert summary(results) == [
        (Status.OK, None, "/home"),
        (Status.OK, None, "/lustre"),
        (Status.OK, None, "/scratch"),
    ]
    assert not list((host / "home").iterdir())  # the probe file is gone


def test_unmounted_and_read_only_in_the_tree(host: Path) -> None:
    mounts = host / "proc/mounts"
    lines = mounts.read_text().splitlines()
    lines = [line for line in lines if " /lustre " not in line]
    lines = [line.replace("/scratch ext4 rw,", "/scratch ext4 ro,") for line in lines]
    mounts.write_text("\n".join(lines) + "\n")
    results = run(FilesystemsCheck(), host, OsMountOps())
    assert summary(results) == [
        (Status.OK, None, "/home"),
        (Status.CRITICAL, "fs.missing", "/lustre"),
        (Status.CRITICAL, "fs.unwritable", "/scratch"),
    ]


def test_failed_write_probe(host: Path, fake: FakeMountOps) -> None:
    fake.unwritable["home"] = PermissionError(13, "Permission denied")
    results = run(FilesystemsCheck(), host, fake)
    assert summary(results)[0] == (Status.CRITICAL, "fs.unwritable", "/home")
    assert "Permission denied" in results[0].message


def test_hung_mount_is_critical_within_the_timeout(host: Path, fake: FakeMountOps) -> None:
    fake.hang.add("lustre")
    check = FilesystemsCheck()
    begin = time.monotonic()
    results = run(check, host, fake)
    assert time.monotonic() - begin < 2.0
    assert summary(results) == [
        (Status.OK, None, "/home"),
        (Status.CRITICAL, "fs.hung", "/lustre"),
        (Status.OK, None, "/scratch"),
    ]

    # The next run does not pile a second probe onto the hung mount.
    again = run(check, host, fake)
    assert again[1].fault_class == "fs.hung" and "still hung since" in again[1].message
    assert fake.calls.count("lustre") == 1

    fake.release.set()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        results = run(check, host, fake)
        if results[1].status is Status.OK:
            break
    assert summary(results)[1] == (Status.OK, None, "/lustre")
    assert fake.calls.count("lustre") == 2
