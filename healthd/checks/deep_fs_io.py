"""Filesystem I/O throughput, natively: write and fsync N MiB to a temporary file under a
configured directory (below the host root), drop it from the page cache, read it back,
report MB/s both ways, remove the file.

The work runs in a `BoundedCall`: a directory on a hung filesystem leaves the worker thread
in uninterruptible sleep, the check answers CRITICAL `fs.io.hung` at `io_timeout`, and no
second probe starts on that directory while the first is stuck. Inside the worker the
write and the read each stop at half of `io_timeout`, so a slow disk yields a low (and
true) rate over what was moved rather than a timeout. MB is 10^6 bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Result,
    Status,
    Tier,
    not_applicable,
    ok,
    register,
    setting,
)
from healthd.checks.deep_common import deep_fault
from healthd.hostfs import BoundedCall, CallTimedOut, private_file

NAME = "deep_fs_io"
MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class DeepFsIoConfig(CheckConfig):
    directory: str = setting(
        "/var/tmp", doc="host directory the probe file goes in (a local scratch disk)"
    )
    size_mib: int = setting(256, minimum=1, doc="MiB written and read back")
    block_kib: int = setting(1024, minimum=4, doc="KiB per write and read call")
    io_timeout: float = setting(
        120.0, minimum=0.1, doc="seconds for the whole probe before fs.io.hung"
    )
    min_write_mbps: float = setting(100.0, minimum=0, doc="write+fsync floor in MB/s; 0 = none")
    min_read_mbps: float = setting(100.0, minimum=0, doc="read floor in MB/s; 0 = none")

    def problems(self) -> Iterator[tuple[str, str, str]]:
        if not self.directory.startswith("/"):
            yield "directory", f"{self.directory!r} is not absolute", "write it as /path"
        if self.timeout is not None and self.io_timeout >= self.timeout:
            yield (
                "io_timeout",
                f"{self.io_timeout:g}s is not below the check timeout {self.timeout:g}s",
                "lower io_timeout or raise timeout",
            )


@dataclass(frozen=True)
class IoReading:
    written_bytes: int
    write_seconds: float  # including the fsync
    read_bytes: int
    read_seconds: float
    complete: bool  # the whole size was written and read back within the time budget
    error: str | None = None

    @property
    def write_mbps(self) -> float:
        return self.written_bytes / 1e6 / self.write_seconds if self.write_seconds > 0 else 0.0

    @property
    def read_mbps(self) -> float:
        return self.read_bytes / 1e6 / self.read_seconds if self.read_seconds > 0 else 0.0


@dataclass(frozen=True)
class DeepFsIoObservation:
    directory: str  # the host path, as configured
    present: bool
    reading: IoReading | None = None
    hung_seconds: float | None = None  # set when the probe did not return in io_timeout
    still_hung: bool = False  # a previous probe on this directory has not returned yet


def _drop_cache(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def measure_io(
    directory: Path, size: int, block: int, budget: float, clock: Callable[[], float]
) -> IoReading | None:
    """Write `size` bytes (incompressible) in `block`-byte calls, fsync, drop the pages,
    read them back, unlink. Each phase stops after `budget` seconds. None when the
    directory does not exist (even that stat can hang on a dead server, so it is here).
    The file is created with `private_file`: a random name, never through a symlink."""
    if not directory.is_dir():
        return None
    data = memoryview(os.urandom(block))
    written = read = 0
    write_s = read_s = 0.0
    try:
        # One fd for both phases: the file is never looked up by name again (private_file).
        with private_file(directory, ".medic-deep-io", os.O_RDWR) as fd:
            start = clock()
            while written < size and clock() - start < budget:
                written += os.write(fd, data[: min(block, size - written)])
            os.fsync(fd)
            write_s = clock() - start
            _drop_cache(fd)
            os.lseek(fd, 0, os.SEEK_SET)
            start = clock()
            while clock() - start < budget:
                chunk = os.read(fd, block)
                if not chunk:
                    break
                read += len(chunk)
            read_s = clock() - start
    except OSError as exc:
        return IoReading(written, write_s, read, read_s, False, f"{directory}: {exc}")
    return IoReading(written, write_s, read, read_s, written == size and read == size)


@register(
    name=NAME,
    tiers=(Tier.DEEP,),
    interval=86400,
    timeout=300,
    needs=("host", "clock"),
    faults={
        "fs.io.hung": Fault(
            Status.CRITICAL, "the I/O probe did not answer in time (still hung on later runs)"
        ),
        "fs.io.error": Fault(Status.CRITICAL, "the I/O probe failed"),
        "fs.io.throughput": Fault(
            Status.CRITICAL,
            "write+fsync or read-back throughput below min_write_mbps / min_read_mbps",
        ),
    },
)
class DeepFsIoCheck(Check[DeepFsIoObservation, DeepFsIoConfig]):
    """Filesystem write+fsync and read-back throughput in a scratch directory."""

    config_type = DeepFsIoConfig

    def __init__(self) -> None:
        self._hung: dict[str, BoundedCall[IoReading | None]] = {}

    def gather(self, ctx: CheckContext, cfg: DeepFsIoConfig) -> DeepFsIoObservation:
        where = ctx.roots.path(cfg.directory)
        stuck = self._hung.get(cfg.directory)
        if stuck is not None:
            if stuck.alive:
                since = ctx.clock.monotonic() - stuck.started_at
                return DeepFsIoObservation(cfg.directory, True, None, since, still_hung=True)
            del self._hung[cfg.directory]
        clock = ctx.clock.monotonic
        call = BoundedCall(
            lambda: measure_io(
                where, cfg.size_mib * MIB, cfg.block_kib * 1024, cfg.io_timeout / 2, clock
            ),
            name=f"{NAME}:{cfg.directory}",
            started_at=clock(),
        )
        try:
            reading = call.wait(cfg.io_timeout)
        except CallTimedOut:
            self._hung[cfg.directory] = call
            return DeepFsIoObservation(cfg.directory, True, None, cfg.io_timeout)
        return DeepFsIoObservation(cfg.directory, reading is not None, reading)

    @staticmethod
    def evaluate(observation: DeepFsIoObservation, cfg: DeepFsIoConfig) -> list[Result]:
        target = observation.directory
        if not observation.present:
            return [
                not_applicable(NAME, f"{target} does not exist on this node", {"directory": target})
            ]
        if observation.hung_seconds is not None or observation.reading is None:
            seconds = observation.hung_seconds or 0.0
            again = "still " if observation.still_hung else ""
            return [
                deep_fault(
                    NAME,
                    Status.CRITICAL,
                    "fs.io.hung",
                    f"{target}: I/O probe {again}without an answer after {seconds:.0f}s",
                    target=target,
                    evidence={"directory": target, "seconds": round(seconds, 1)},
                )
            ]
        reading = observation.reading
        evidence = {
            "directory": target,
            "written_bytes": reading.written_bytes,
            "read_bytes": reading.read_bytes,
            "write_seconds": round(reading.write_seconds, 3),
            "read_seconds": round(reading.read_seconds, 3),
            "write_mbps": round(reading.write_mbps, 1),
            "read_mbps": round(reading.read_mbps, 1),
            "complete": reading.complete,
            "min_write_mbps": cfg.min_write_mbps,
            "min_read_mbps": cfg.min_read_mbps,
        }
        if reading.error is not None:
            return [
                deep_fault(
                    NAME,
                    Status.CRITICAL,
                    "fs.io.error",
                    f"{target}: I/O probe failed: {reading.error}",
                    target=target,
                    evidence={**evidence, "error": reading.error},
                )
            ]
        slow = []
        if cfg.min_write_mbps and reading.write_mbps < cfg.min_write_mbps:
            slow.append(f"write+fsync {reading.write_mbps:.1f} MB/s < {cfg.min_write_mbps:g}")
        if cfg.min_read_mbps and reading.read_mbps < cfg.min_read_mbps:
            slow.append(f"read {reading.read_mbps:.1f} MB/s < {cfg.min_read_mbps:g}")
        if slow:
            return [
                deep_fault(
                    NAME,
                    Status.CRITICAL,
                    "fs.io.throughput",
                    f"{target}: {'; '.join(slow)}",
                    target=target,
                    evidence=evidence,
                )
            ]
        return [
            ok(
                NAME,
                f"{target}: write+fsync {reading.write_mbps:.1f} MB/s,"
                f" read {reading.read_mbps:.1f} MB/s ({reading.written_bytes // MIB} MiB)",
                target=target,
                evidence=evidence,
            )
        ]
