"""The SQLite store holds RMA tickets and events: root only (issue 11, item 4)."""

from __future__ import annotations

import datetime as dt
import os
import stat
from pathlib import Path

import pytest

from medic_core.store import Severity, open_store
from medic_core.store.engine import StoreError


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _write(store_path: Path) -> None:
    with open_store(f"sqlite:///{store_path}") as store:
        store.add_event(
            "n1", at=dt.datetime.now(dt.UTC), kind="admin", severity=Severity.WARN,
            source="test", message="RMA ticket text", evidence={},
        )  # fmt: skip
        wal, shm = Path(f"{store_path}-wal"), Path(f"{store_path}-shm")
        assert wal.exists() and shm.exists()  # WAL mode, while the store is open
        assert (_mode(wal), _mode(shm)) == (0o600, 0o600)


@pytest.fixture
def loose_umask() -> object:
    old = os.umask(0o022)  # the usual umask: SQLite alone would make the files 0644
    yield
    os.umask(old)


def test_a_fresh_store_is_root_only(tmp_path: Path, loose_umask: object) -> None:
    db = tmp_path / "var/lib/medic/medic.db"
    _write(db)
    assert _mode(db.parent) == 0o700
    assert _mode(db) == 0o600
    for suffix in ("-wal", "-shm"):
        side = Path(f"{db}{suffix}")
        if side.exists():
            assert _mode(side) == 0o600


def test_an_old_store_is_tightened_on_open(tmp_path: Path, loose_umask: object) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    db = shared / "medic.db"
    _write(db)
    for suffix in ("", "-wal", "-shm"):
        side = Path(f"{db}{suffix}")
        if side.exists():
            side.chmod(0o644)
    open_store(f"sqlite:///{db}").close()
    assert _mode(db) == 0o600
    assert _mode(shared) == 0o755  # a directory it did not create keeps its mode
    _write(db)  # and the -wal/-shm it makes next are 0600 (asserted inside)


def test_a_symlink_at_the_store_name_is_not_chmodded_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x")
    victim.chmod(0o644)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "medic.db").symlink_to(victim)
    with pytest.raises(StoreError, match=r"medic\.db"):
        open_store(f"sqlite:///{tmp_path / 'store' / 'medic.db'}")
    assert _mode(victim) == 0o644


def test_a_fifo_at_the_store_name_is_a_clear_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "medic.db")
    with pytest.raises(StoreError, match="not a regular file"):
        open_store(f"sqlite:///{tmp_path / 'medic.db'}")
