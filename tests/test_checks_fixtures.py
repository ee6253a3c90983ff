"""The host tree generator shared by the tests and the lab."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.fixtures import write_host_tree
from healthd.hostfs import HostRoots, list_dir, read_int, read_text, read_value


def test_h100_tree_layout(tmp_path: Path) -> None:
    write_host_tree(tmp_path)
    ib = list_dir(tmp_path, "sys/class/infiniband")
    assert ib == [f"mlx5_{i}" for i in range(9)]
    port = "sys/class/infiniband/mlx5_0/ports/1"
    assert read_value(tmp_path, f"{port}/state") == "4: ACTIVE"
    assert read_value(tmp_path, f"{port}/phys_state") == "5: LinkUp"
    assert read_value(tmp_path, f"{port}/rate") == "400 Gb/sec (4X NDR)"
    assert read_int(tmp_path, f"{port}/counters/symbol_error") == 0
    meminfo = read_text(tmp_path, "proc/meminfo") or ""
    assert meminfo.startswith("MemTotal:       2113561600 kB\n")
    assert "HugePages_Total:       0\nHugePages_Free:        0\n" in meminfo
    mounts = read_text(tmp_path, "proc/mounts") or ""
    assert " /lustre lustre " in mounts and " /home nfs4 " in mounts
    roots = HostRoots(tmp_path)
    assert roots.path("/lustre").is_dir() and roots.path("/") == tmp_path
    assert read_value(tmp_path, "proc/1002/comm") == "nvidia-persiste"
    assert (tmp_path / "dev/kmsg").read_text() == ""


def test_rewriting_a_tree_is_safe_and_unknown_profiles_fail(tmp_path: Path) -> None:
    write_host_tree(tmp_path)
    write_host_tree(tmp_path)
    with pytest.raises(ValueError, match="known: h100-8gpu"):
        write_host_tree(tmp_path, "dgx-a100")


def test_reader_keeps_absent_apart_from_failed(tmp_path: Path) -> None:
    assert read_text(tmp_path, "sys/nothing") is None
    assert list_dir(tmp_path, "sys/nothing") is None
    (tmp_path / "file").write_text("x")
    assert read_text(tmp_path, "file/below") is None  # NOT a directory: absent, not failure
    (tmp_path / "dir").mkdir()
    with pytest.raises(IsADirectoryError):
        read_text(tmp_path, "dir")
    with pytest.raises(ValueError):
        HostRoots(tmp_path).path("/../etc")


def test_reader_reads_past_one_chunk_up_to_its_bound_and_across_odd_bytes(tmp_path: Path) -> None:
    from healthd.hostfs import READ_CHUNK

    big = bytes(range(256)) * (READ_CHUNK // 128 + 3)  # more than two chunks, every byte
    (tmp_path / "big").write_bytes(big)
    assert read_text(tmp_path, "big") == big.decode("utf-8", errors="replace")
    clipped = read_text(tmp_path, "big", max_bytes=READ_CHUNK + 5)
    assert clipped == big[: READ_CHUNK + 5].decode("utf-8", errors="replace")
    assert read_text(tmp_path, "big", max_bytes=0) == ""
    (tmp_path / "empty").write_bytes(b"")
    assert read_text(tmp_path, "empty") == ""
    (tmp_path / "link").symlink_to(tmp_path / "big")  # sysfs is symlinks: followed
    assert read_text(tmp_path, "link") == read_text(tmp_path, "big")
