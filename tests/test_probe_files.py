"""Files Medic (root) creates where users can write: never through a symlink, never blocking
on a FIFO, never at a name a user can guess (issue 11, item 1)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from healthd.checks.base import CheckContext, Status
from healthd.checks.deep_fs_io import measure_io
from healthd.checks.filesystems import FilesystemsCheck, FilesystemsConfig
from healthd.fixtures import write_host_tree
from healthd.hostfs import OsMountOps, private_file

SECRET = b"root-owned content\n"
FIXED = "f" * 32


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    target = tmp_path / "victim"
    target.write_bytes(SECRET)
    target.chmod(0o600)
    return target


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


def _guess(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacker guessed the random part (as if it were predictable)."""
    monkeypatch.setattr("healthd.hostfs.secrets.token_hex", lambda _n=None: FIXED)


def _in_thread(fn: object, deadline: float = 5.0) -> BaseException | None:
    """Run fn in a thread; fail the test if it does not return before the deadline."""
    box: list[BaseException | None] = []

    def body() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:  # the test looks at it
            box.append(exc)
        else:
            box.append(None)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(deadline)
    assert not t.is_alive(), f"blocked for more than {deadline}s"
    return box[0]


def test_the_old_predictable_name_is_not_written_through(shared: Path, victim: Path) -> None:
    old_name = shared / f".medic-probe.{socket.gethostname()}.{os.getpid()}"
    old_name.symlink_to(victim)
    OsMountOps().write_probe(shared)
    assert victim.read_bytes() == SECRET
    assert old_name.is_symlink()  # the planted link is not ours to remove either
    assert sorted(p.name for p in shared.iterdir()) == [old_name.name]  # our file is gone


def test_a_guessed_name_with_a_symlink_is_refused_not_followed(
    shared: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _guess(monkeypatch)
    (shared / f".medic-probe.{FIXED}").symlink_to(victim)
    with pytest.raises(FileExistsError):
        OsMountOps().write_probe(shared)
    assert victim.read_bytes() == SECRET
    assert (shared / f".medic-probe.{FIXED}").is_symlink()


def test_a_dangling_symlink_does_not_create_its_target(
    shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _guess(monkeypatch)
    target = tmp_path / "etc-cron-d-evil"
    (shared / f".medic-probe.{FIXED}").symlink_to(target)
    with pytest.raises(FileExistsError):
        OsMountOps().write_probe(shared)
    assert not target.exists()


def test_a_fifo_at_the_name_neither_hangs_nor_is_drained(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _guess(monkeypatch)
    fifo = shared / f".medic-probe.{FIXED}"
    os.mkfifo(fifo)
    begin = time.monotonic()
    error = _in_thread(lambda: OsMountOps().write_probe(shared))
    assert isinstance(error, FileExistsError)
    assert time.monotonic() - begin < 5
    assert fifo.exists()  # not unlinked: it is not ours


def test_the_directory_itself_being_a_symlink_is_refused(tmp_path: Path, victim: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(OSError):
        OsMountOps().write_probe(link)
    assert list(real.iterdir()) == []


def test_private_file_is_0600_random_and_removed(shared: Path) -> None:
    names = set()
    for _ in range(3):
        with private_file(shared, ".medic-probe") as fd:
            st = os.fstat(fd)
            assert st.st_mode & 0o777 == 0o600
            (name,) = [p.name for p in shared.iterdir()]
            names.add(name)
        assert list(shared.iterdir()) == []
    assert len(names) == 3
    assert all(len(n.rsplit(".", 1)[1]) == 32 for n in names)


def test_filesystems_check_reports_a_planted_symlink_as_unwritable_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = tmp_path / "host"
    write_host_tree(host)
    victim = tmp_path / "shadow"
    victim.write_bytes(SECRET)
    _guess(monkeypatch)
    (host / "home" / f".medic-probe.{FIXED}").symlink_to(victim)
    cfg = FilesystemsConfig(required_mounts=("/home",), mount_timeout=3)
    ctx = CheckContext.for_root(host, mounts=OsMountOps())
    results = FilesystemsCheck.evaluate(FilesystemsCheck().gather(ctx, cfg), cfg)
    assert [(r.status, r.fault_class) for r in results] == [(Status.CRITICAL, "fs.unwritable")]
    assert victim.read_bytes() == SECRET


def test_deep_io_probe_does_not_write_through_the_old_name(shared: Path, victim: Path) -> None:
    old_name = shared / f".medic-deep-io.{socket.gethostname()}.{os.getpid()}"
    old_name.symlink_to(victim)
    reading = measure_io(shared, 1 << 16, 1 << 12, 5.0, time.monotonic)
    assert reading is not None and reading.complete and reading.error is None
    assert reading.written_bytes == reading.read_bytes == 1 << 16
    assert victim.read_bytes() == SECRET
    assert sorted(p.name for p in shared.iterdir()) == [old_name.name]


def test_deep_io_probe_refuses_a_guessed_fifo_without_hanging(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _guess(monkeypatch)
    os.mkfifo(shared / f".medic-deep-io.{FIXED}")
    box: list[object] = []
    assert (
        _in_thread(lambda: box.append(measure_io(shared, 4096, 4096, 5.0, time.monotonic))) is None
    )
    (reading,) = box
    assert reading is not None and reading.error is not None  # type: ignore[attr-defined]
    assert "exists" in reading.error  # type: ignore[attr-defined]
