"""Reading the kernel log from /dev/kmsg (Documentation/ABI/testing/dev-kmsg).

Each record is one header line and optional continuation lines:

    6,1532,93475911,-;mlx5_core 0000:18:00.0: firmware version: 28.39.1002
     SUBSYSTEM=pci
     DEVICE=+pci:0000:18:00.0

The header is `prefix,seq,timestamp_us,flags[,more];message`, where prefix is
facility * 8 + level and flags is "-" ("c" and "+" on older kernels); continuation lines
start with a space and carry KEY=value pairs. On the real device every read() returns one
whole record, a fresh descriptor starts at the oldest record still in the ring buffer,
EAGAIN means "no more for now" with O_NONBLOCK, and EPIPE means records were overwritten
before we read them. A regular file in the same format (a fixture tree) reads the same way.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MAX_READ_BYTES = 16 << 20  # larger than any kernel ring buffer in practice
_READ_CHUNK = 64 << 10  # one read must hold a whole record on the real device


@dataclass(frozen=True)
class KmsgRecord:
    seq: int
    level: int  # 0 (emerg) .. 7 (debug)
    facility: int  # 0 for the kernel
    timestamp_us: int  # since boot, the kernel's local_clock (see wall_time)
    flags: str
    message: str
    fields: Mapping[str, str] = field(default_factory=dict)  # SUBSYSTEM=, DEVICE=, ...


@dataclass(frozen=True)
class KmsgBatch:
    records: tuple[KmsgRecord, ...]
    last_seq: int | None  # the highest seq seen, to continue from next time
    lost: int = 0  # records overwritten before they were read
    malformed: int = 0  # lines that were neither a record nor a continuation
    restarted: bool = False  # sequence numbers went backwards: a new log (or a new boot)


TIGHT_BRACKET = 50e-6  # seconds: two monotonic reads this close left no room to be preempted


def boot_wall(wall: float, monotonic: float) -> float:
    """The wall time (Unix seconds) of the kernel log's zero: CLOCK_REALTIME minus
    CLOCK_MONOTONIC, read back to back (`time.time()`, `time.monotonic()`, or a check's
    clock). Better than /proc/stat's btime, which is whole seconds."""
    return wall - monotonic


def read_boot_wall(
    monotonic: Callable[[], float], wall: Callable[[], float], tries: int = 3
) -> float:
    """`boot_wall` from the clocks themselves: the wall time read between two monotonic
    reads, the tightest bracket of `tries`. A thread preempted between two plain reads (a
    loaded node: milliseconds) would put every kernel-log time off by as long."""
    best: tuple[float, float] | None = None
    for _ in range(tries):
        before = monotonic()
        now = wall()
        after = monotonic()
        if best is None or after - before < best[0]:
            best = (after - before, boot_wall(now, (before + after) / 2))
        if best[0] < TIGHT_BRACKET:
            break
    assert best is not None
    return best[1]


def wall_time(timestamp_us: int, boot: float, monotonic_now: float) -> dt.datetime | None:
    """When a record was logged, as a UTC wall time: `boot` (see `boot_wall`) plus its
    timestamp. None for a timestamp later than `monotonic_now` (not this boot's, or not a
    kernel's), or one no datetime holds.

    The kernel stamps records with local_clock() (sched_clock: on x86 the TSC at the rate
    calibrated at boot), which NTP does not discipline while it does slew CLOCK_MONOTONIC:
    the two part by the TSC's frequency error times the uptime (10 ppm is about 0.9 s a day
    of uptime). So a fault's time from the kernel log is exact on a freshly booted node and
    drifts on a long-running one; `medic report` flags a fault time later than Medic's
    knowing as clock skew. A suspended host (not a GPU node) would also split the clocks.
    """
    seconds = timestamp_us / 1e6
    if timestamp_us < 0 or seconds > monotonic_now + 1.0:
        return None
    try:
        return dt.datetime.fromtimestamp(boot + seconds, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None


def parse_header(line: str) -> KmsgRecord | None:
    head, sep, message = line.partition(";")
    if not sep:
        return None
    parts = head.split(",")
    if len(parts) < 4:
        return None
    try:
        prefix, seq, ts = int(parts[0]), int(parts[1]), int(parts[2])
    except ValueError:
        return None
    if prefix < 0 or seq < 0:
        return None
    return KmsgRecord(
        seq=seq,
        level=prefix & 7,
        facility=prefix >> 3,
        timestamp_us=ts,
        flags=parts[3],
        message=message,
    )


def parse_records(text: str) -> tuple[list[KmsgRecord], int]:
    """Records in `text`, and the number of malformed lines skipped."""
    records: list[KmsgRecord] = []
    pending: dict[str, str] = {}
    malformed = 0

    def flush() -> None:
        if records and pending:
            last = records[-1]
            records[-1] = KmsgRecord(
                last.seq,
                last.level,
                last.facility,
                last.timestamp_us,
                last.flags,
                last.message,
                dict(pending),
            )
        pending.clear()

    for line in text.split("\n"):
        if not line:
            continue
        if line.startswith(" "):
            key, sep, value = line[1:].partition("=")
            if records and sep:
                pending[key] = value
            else:
                malformed += 1
            continue
        record = parse_header(line)
        if record is None:
            malformed += 1
            continue
        flush()
        records.append(record)
    flush()
    return records, malformed


def read_raw(path: Path, *, max_bytes: int = MAX_READ_BYTES) -> tuple[str, int]:
    """Everything currently readable from `path` and the number of EPIPE gaps met."""
    chunks: list[bytes] = []
    size = 0
    gaps = 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        while size < max_bytes:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    gaps += 1
                    continue
                raise
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace"), gaps


def select_after(
    records: Iterable[KmsgRecord], after_seq: int | None, *, malformed: int = 0, gaps: int = 0
) -> KmsgBatch:
    """The records newer than `after_seq` (all when None), with loss accounting."""
    every = list(records)
    highest = max((r.seq for r in every), default=None)
    restarted = after_seq is not None and highest is not None and highest < after_seq
    fresh = every if after_seq is None or restarted else [r for r in every if r.seq > after_seq]
    lost = gaps
    if after_seq is not None and not restarted and fresh:
        lost += max(0, fresh[0].seq - after_seq - 1)
    last = highest if highest is not None else after_seq
    return KmsgBatch(tuple(fresh), last, lost, malformed, restarted)


def read_since(
    path: Path, after_seq: int | None = None, *, max_bytes: int = MAX_READ_BYTES
) -> KmsgBatch:
    """The records in /dev/kmsg (or a file in its format) with seq > after_seq."""
    text, gaps = read_raw(path, max_bytes=max_bytes)
    records, malformed = parse_records(text)
    return select_after(records, after_seq, malformed=malformed, gaps=gaps)


class KmsgFollower:
    """Reads only what is new on each poll. Holds one integer of state; `start_at_end`
    skips what was logged before the first poll."""

    def __init__(self, path: Path, *, start_at_end: bool = False) -> None:
        self.path = path
        self.last_seq: int | None = None
        self._skip_first = start_at_end

    def poll(self) -> KmsgBatch:
        batch = read_since(self.path, self.last_seq)
        self.last_seq = batch.last_seq
        if self._skip_first:
            self._skip_first = False
            return KmsgBatch((), batch.last_seq, 0, batch.malformed, False)
        return batch


def format_record(
    seq: int,
    message: str,
    *,
    timestamp_us: int | None = None,
    level: int = 6,
    facility: int = 0,
    fields: Mapping[str, str] | None = None,
) -> str:
    """One record as the kernel prints it (for fixtures, the lab and tests)."""
    ts = seq * 1000 if timestamp_us is None else timestamp_us
    lines = [f"{facility * 8 + level},{seq},{ts},-;{message}"]
    lines += [f" {k}={v}" for k, v in (fields or {}).items()]
    return "\n".join(lines) + "\n"
