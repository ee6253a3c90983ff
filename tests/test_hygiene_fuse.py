"""A process that survives SIGTERM and SIGKILL, made the way the kernel really makes one: a
read from a FUSE file system whose server took the request and never answers. It stands for
what Slurm's "Kill task failed" is about on real nodes: a task in uninterruptible sleep in a
hung network file system (NFS hard mounts, Lustre) or a GPU driver call. In fs/fuse/dev.c a
fatal signal ends the wait only while the request is still queued; once the server has read
it, the task waits uninterruptibly (state D) until the server answers or the connection is
aborted (the server exits). Ending the server is how the test makes it "exit by itself".

`python -m tests.test_hygiene_fuse MOUNTPOINT` serves a file system with one file, `stuck`,
whose reads are never answered; it mounts it itself (root, /dev/fuse) and runs until killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat
import struct
import sys
import time
from pathlib import Path

import pytest

from medic_core import proc
from slurm_hooks import hygiene as hy
from tests.conftest import poll

LOOKUP, FORGET, GETATTR, OPEN, READ, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 15, 18, 25, 26
OPENDIR, RELEASEDIR, INTERRUPT, DESTROY, BATCH_FORGET = 27, 29, 36, 38, 42
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}
IN_HEADER = struct.Struct("<IIQQIIII")
OUT_HEADER = struct.Struct("<IiQ")
STUCK = 2  # the node id of `stuck`


def _attr(node: int) -> bytes:
    mode, nlink, size = (
        (stat.S_IFDIR | 0o755, 2, 0) if node == 1 else (stat.S_IFREG | 0o444, 1, 4096)
    )
    return struct.pack("<QQQQQQIIIIIIIIII", node, size, 0, 0, 0, 0, 0, 0, 0, mode, nlink,
                       0, 0, 0, 4096, 0)  # fmt: skip


def _reply(fd: int, unique: int, body: bytes = b"", error: int = 0) -> None:
    os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique) + body)


def serve(mountpoint: str) -> None:
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"medic-stall", mountpoint.encode(), b"fuse.medic-stall", 0, options) != 0:
        raise OSError(ctypes.get_errno(), f"mount {mountpoint}")
    print("mounted", flush=True)
    held = []  # the unanswered reads
    while True:
        try:
            data = os.read(fd, 1 << 20)
        except OSError:  # ENODEV: unmounted
            return
        _, opcode, unique, node, *_ = IN_HEADER.unpack_from(data)
        body = data[IN_HEADER.size :]
        if opcode in NO_REPLY:
            continue
        if opcode == INIT:
            _major, minor = struct.unpack_from("<II", body)
            _reply(fd, unique, struct.pack("<IIIIHHI", 7, min(minor, 19), 0, 0, 16, 12, 4096))
        elif opcode == LOOKUP and body.rstrip(b"\0") == b"stuck":
            _reply(fd, unique, struct.pack("<QQQQII", STUCK, 0, 0, 0, 0, 0) + _attr(STUCK))
        elif opcode == LOOKUP:
            _reply(fd, unique, error=2)  # ENOENT
        elif opcode == GETATTR:
            _reply(fd, unique, struct.pack("<QII", 0, 0, 0) + _attr(node))
        elif opcode in (OPEN, OPENDIR):
            _reply(fd, unique, struct.pack("<QII", 1, 1, 0))  # FOPEN_DIRECT_IO: no page cache
        elif opcode == READ and node == STUCK:
            held.append(unique)  # read, never answered: the reader is stuck for good
            print(f"holding read {unique}", flush=True)
        elif opcode in (RELEASE, RELEASEDIR, FLUSH):
            _reply(fd, unique)
        else:
            _reply(fd, unique, error=38)  # ENOSYS


def unmount(mountpoint: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(str(mountpoint).encode(), 2)  # MNT_DETACH


def start_server(mountpoint: Path, log: Path) -> int:
    mountpoint.mkdir(parents=True, exist_ok=True)
    pid = proc.spawn([sys.executable, "-m", "tests.test_hygiene_fuse", str(mountpoint)],
                     log_path=log, cwd=Path(__file__).parent.parent)  # fmt: skip
    poll("the FUSE server to mount", lambda: log.exists() and "mounted" in log.read_text())
    return pid


def stop_server(pid: int, mountpoint: Path) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    unmount(mountpoint)


needs_fuse = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/dev/fuse").exists(), reason="needs root and /dev/fuse"
)


@needs_fuse
def test_a_reader_of_a_hung_fuse_file_survives_term_and_kill_and_goes_with_the_server(
    tmp_path: Path,
) -> None:
    mnt = tmp_path / "mnt"
    server = start_server(mnt, tmp_path / "server.log")
    try:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_ID": "990000001"}
        reader = proc.spawn(["cat", str(mnt / "stuck")], log_path=tmp_path / "cat.log", env=env)
        poll("the read to be held", lambda: "holding read" in (tmp_path / "server.log").read_text())
        job = hy.JobOwner("990000001", 0, "root", "hyg-node")
        scope = hy.Scope(job, by_user=False, user_files=False)
        proc_root = Path("/proc")
        [found] = hy.find_processes(proc_root, scope, hy.ancestors(proc_root, os.getpid()))
        assert found.pid == reader and found.why == "job environment"
        started = time.monotonic()
        left = hy.end_processes(
            [found], lambda p: hy.alive(proc_root, p), hy.pidfd_signaller(proc_root),
            grace=0.3, kill_wait=0.5, deadline=started + 5,
        )  # fmt: skip
        assert [p.pid for p in left] == [reader]
        st = hy.read_stat(proc_root, reader)
        assert st is not None and st.state == "D", st
    finally:
        stop_server(server, mnt)
    poll("the reader to go once the server is gone", lambda: not hy.alive(Path("/proc"), found))


if __name__ == "__main__":
    serve(sys.argv[1])
