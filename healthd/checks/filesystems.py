"""Required mounts: present in the host's mount table, not hung, writable, with free space and
inodes."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from collections.abc import Iterator, Mapping
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
    fault,
    not_applicable,
    ok,
    register,
    setting,
)
from healthd.hostfs import BoundedCall, CallTimedOut, FsUsage, HostRoots, MountOps, read_text

NAME = "filesystems"
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True, kw_only=True)
class FilesystemsConfig(CheckConfig):
    required_mounts: tuple[str, ...] = setting((), doc="mount points that must be mounted")
    read_only_mounts: tuple[str, ...] = setting(
        (), doc="required mounts that are read-only by design (no write probe)"
    )
    mount_timeout: float = setting(
        5.0, minimum=0.1, doc="seconds a statvfs or write probe may take before fs.hung"
    )
    warn_free_percent: float = setting(5.0, minimum=0, maximum=100, doc="WARN fs.full below")
    critical_free_percent: float = setting(
        1.0, minimum=0, maximum=100, doc="CRITICAL fs.full below"
    )
    warn_free_inodes_percent: float = setting(
        5.0, minimum=0, maximum=100, doc="WARN fs.inodes below"
    )
    critical_free_inodes_percent: float = setting(
        1.0, minimum=0, maximum=100, doc="CRITICAL fs.inodes below"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for path in (*self.required_mounts, *self.read_only_mounts):
            if not path.startswith("/"):
                yield "required_mounts", f"{path!r} is not absolute", "write it as /path"
        stray = set(self.read_only_mounts) - set(self.required_mounts)
        if stray:
            yield (
                "read_only_mounts",
                f"{sorted(stray)} not in required_mounts",
                "list them in required_mounts too",
            )
        if self.timeout is not None and self.mount_timeout >= self.timeout:
            yield (
                "mount_timeout",
                f"{self.mount_timeout:g}s is not below the check timeout {self.timeout:g}s",
                "make mount_timeout smaller than timeout",
            )


@dataclass(frozen=True)
class MountEntry:
    device: str
    mount_point: str
    fstype: str
    options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


@dataclass(frozen=True)
class MountProbe:
    mount_point: str
    entry: MountEntry | None  # None: not in the mount table
    usage: FsUsage | None = None
    write_error: str | None = None  # None: written (or not attempted)
    wrote: bool = False
    error: str | None = None  # statvfs failed: stale handle, I/O error
    hung_seconds: float | None = None  # no answer within the mount timeout
    hung_since: str | None = None  # an earlier probe of this mount still has not returned


@dataclass(frozen=True)
class FilesystemsObservation:
    probes: tuple[MountProbe, ...]


def parse_mounts(text: str) -> dict[str, MountEntry]:
    """/proc/mounts by mount point; the last mount on a point is the visible one."""

    def unescape(field: str) -> str:
        return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)

    table: dict[str, MountEntry] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        entry = MountEntry(
            unescape(parts[0]), unescape(parts[1]), parts[2], tuple(parts[3].split(","))
        )
        table[entry.mount_point] = entry
    return table


def host_view(roots: HostRoots) -> tuple[Path, HostRoots]:
    """The mount table to read and the root that mount points are reached through.

    The shipped unit's sandbox (ProtectSystem=strict, ProtectHome=read-only) gives the daemon
    a mount namespace in which every site mount is read-only, so its own /proc/self/mounts
    and a write probe through its own / would call every node's scratch unwritable. PID 1's
    mount table is the host's, and /proc/1/root reaches the host's mounts, so the check
    reads and probes through them. A daemon that cannot look through PID 1 (not root, no
    CAP_SYS_PTRACE, hidepid) or a fixture tree without /proc/1 uses its own view."""
    pid1 = roots.proc / "1"
    try:
        if os.path.isdir(pid1 / "root" / "") and os.access(pid1 / "mounts", os.R_OK):
            return pid1 / "mounts", HostRoots(pid1 / "root")
    except OSError:
        pass
    return roots.proc / "mounts", roots


@dataclass(frozen=True)
class _Reading:
    usage: FsUsage
    write_error: str | None
    wrote: bool


def _probe(ops: MountOps, path: Path, write: bool) -> _Reading:
    usage = ops.usage(path)
    if not write:
        return _Reading(usage, None, False)
    try:
        ops.write_probe(path)
    except OSError as exc:
        return _Reading(usage, f"{type(exc).__name__}: {exc}", True)
    return _Reading(usage, None, True)


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=60,
    timeout=15,
    needs=("host", "mounts"),
    faults={
        "fs.missing": Fault(Status.CRITICAL, "a required mount point is not in /proc/mounts"),
        "fs.hung": Fault(
            Status.CRITICAL, "statvfs or the write probe did not answer within mount_timeout"
        ),
        "fs.error": Fault(Status.CRITICAL, "statvfs failed (stale handle, I/O error)"),
        "fs.unwritable": Fault(
            Status.CRITICAL, "mounted ro (unless in read_only_mounts), or the write probe failed"
        ),
        "fs.full": Fault(
            (Status.WARN, Status.CRITICAL),
            "free space below warn_free_percent / critical_free_percent",
        ),
        "fs.inodes": Fault(
            (Status.WARN, Status.CRITICAL),
            "free inodes below the inode thresholds (skipped when the filesystem reports 0 inodes)",
        ),
    },
)
class FilesystemsCheck(Check[FilesystemsObservation, FilesystemsConfig]):
    """Required mounts: mounted, answering, writable, with free space and inodes."""

    config_type = FilesystemsConfig

    def __init__(self) -> None:
        # A probe that never returned, per mount point: not started again while it hangs.
        self._hung: dict[str, tuple[BoundedCall[_Reading], str]] = {}

    def gather(self, ctx: CheckContext, cfg: FilesystemsConfig) -> FilesystemsObservation:
        table_path, host = host_view(ctx.roots)
        text = read_text(table_path.parent, table_path.name)
        if text is None:
            raise FileNotFoundError(f"{table_path} is missing")
        table = parse_mounts(text)
        probes: dict[str, MountProbe] = {}
        calls: dict[str, BoundedCall[_Reading]] = {}
        for point in cfg.required_mounts:
            entry = table.get(point)
            if entry is None:
                probes[point] = MountProbe(point, None)
                continue
            hung = self._hung.get(point)
            if hung is not None and hung[0].alive:
                probes[point] = MountProbe(point, entry, hung_since=hung[1])
                continue
            self._hung.pop(point, None)
            write = not entry.read_only and point not in cfg.read_only_mounts
            path, ops = host.path(point), ctx.mounts
            calls[point] = BoundedCall(
                functools.partial(_probe, ops, path, write),
                name=f"fs-probe:{point}",
                started_at=time.monotonic(),
            )
        for point, call in calls.items():
            entry = table[point]
            remaining = call.started_at + cfg.mount_timeout - time.monotonic()
            try:
                reading = call.wait(remaining)
            except CallTimedOut:
                self._hung[point] = (call, ctx.clock.now().isoformat(timespec="seconds"))
                probes[point] = MountProbe(point, entry, hung_seconds=cfg.mount_timeout)
            except OSError as exc:
                probes[point] = MountProbe(point, entry, error=f"{type(exc).__name__}: {exc}")
            else:
                probes[point] = MountProbe(
                    point, entry, reading.usage, reading.write_error, reading.wrote
                )
        return FilesystemsObservation(tuple(probes[p] for p in cfg.required_mounts))

    @staticmethod
    def evaluate(observation: FilesystemsObservation, cfg: FilesystemsConfig) -> list[Result]:
        if not cfg.required_mounts:
            return [not_applicable(NAME, "no required mounts configured")]
        results: list[Result] = []
        for probe in observation.probes:
            findings = list(_findings(probe, cfg))
            results.extend(findings)
            if not findings:
                results.append(
                    ok(
                        NAME,
                        f"{probe.mount_point} mounted and answering",
                        target=probe.mount_point,
                        evidence=_evidence(probe),
                    )
                )
        return results


def _evidence(probe: MountProbe) -> dict[str, object]:
    out: dict[str, object] = {}
    if probe.entry is not None:
        out.update(device=probe.entry.device, fstype=probe.entry.fstype)
    if probe.usage is not None:
        out.update(dataclasses.asdict(probe.usage))
    return out


def _percent(avail: int, total: int) -> float | None:
    return None if total <= 0 else 100.0 * avail / total


def _findings(probe: MountProbe, cfg: FilesystemsConfig) -> Iterator[Result]:
    point = probe.mount_point
    evidence: Mapping[str, object] = _evidence(probe)
    if probe.entry is None:
        yield fault(NAME, Status.CRITICAL, "fs.missing", f"{point} is not mounted", target=point)
        return
    if probe.hung_since is not None or probe.hung_seconds is not None:
        why = (
            f"still hung since {probe.hung_since}"
            if probe.hung_since
            else f"no answer within {probe.hung_seconds:g}s"
        )
        yield fault(
            NAME,
            Status.CRITICAL,
            "fs.hung",
            f"{point} ({probe.entry.fstype}) {why}",
            target=point,
            evidence={**evidence, "hung_since": probe.hung_since, "timeout": cfg.mount_timeout},
        )
        return
    if probe.error is not None:
        yield fault(
            NAME,
            Status.CRITICAL,
            "fs.error",
            f"{point}: statvfs failed: {probe.error}",
            target=point,
            evidence={**evidence, "error": probe.error},
        )
        return
    wants_write = point not in cfg.read_only_mounts
    if wants_write and probe.entry.read_only:
        yield fault(
            NAME,
            Status.CRITICAL,
            "fs.unwritable",
            f"{point} is mounted read-only",
            target=point,
            evidence={**evidence, "options": list(probe.entry.options)},
        )
    elif probe.write_error is not None:
        yield fault(
            NAME,
            Status.CRITICAL,
            "fs.unwritable",
            f"{point}: write probe failed: {probe.write_error}",
            target=point,
            evidence={**evidence, "error": probe.write_error},
        )
    if probe.usage is None:
        return
    space = _percent(probe.usage.avail_bytes, probe.usage.total_bytes)
    inodes = _percent(probe.usage.avail_inodes, probe.usage.total_inodes)
    for free, fault_class, what, warn_at, crit_at in (
        (space, "fs.full", "space", cfg.warn_free_percent, cfg.critical_free_percent),
        (
            inodes,
            "fs.inodes",
            "inodes",
            cfg.warn_free_inodes_percent,
            cfg.critical_free_inodes_percent,
        ),
    ):
        if free is None or free >= warn_at:
            continue
        status = Status.CRITICAL if free < crit_at else Status.WARN
        limit = crit_at if status is Status.CRITICAL else warn_at
        yield fault(
            NAME,
            status,
            fault_class,
            f"{point}: {free:.1f}% {what} free (below {limit:g}%)",
            target=point,
            evidence={**evidence, "free_percent": round(free, 2)},
        )
