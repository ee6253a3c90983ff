"""Evidence bundles: what a vendor or an engineer asks for when a node goes to RMA or an
episode needs a human, gathered on the node at that moment and kept as one tar.gz.

A bundle holds `manifest.json` (what was asked, each part's outcome and size), the
episode's findings, the kernel log around the fault, an NVML snapshot of the faulty GPU,
the HCA port counters from sysfs and `nvidia-bug-report.sh`'s report where it is installed.
Each part has its own deadline; a part that fails, hangs or does not fit is noted in the
manifest and the bundle is written without it. Collection runs on its own thread, so the
ladder never waits for it.

Bundles live in `<state_dir>/evidence/` (root-owned, 0700): each file is created with
O_EXCL | O_NOFOLLOW and never replaces what is there, and its sha256 is written beside it
(`<name>.sha256`, in `sha256sum` format). Bundles older than `keep_days`, and the oldest
past `keep_bundles`, are pruned whenever a new one is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import io
import json
import logging
import os
import re
import shutil
import stat
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medic_core import proc
from medic_core.settings import EvidenceSettings

log = logging.getLogger("medic.remediation.evidence")

EVIDENCE_DIR = "evidence"
SUFFIX = ".tar.gz"
PARTIAL = ".partial"
HCA_FILE_BYTES = 4096  # one sysfs counter is a number; anything longer is not a counter
HCA_MAX_FILES = 4096  # a node has a handful of ports, each with ~100 counters

# The callables a daemon supplies; each returns the part's bytes (or JSON for nvml).
KernelLog = Callable[[dt.datetime | None], str]
NvmlSnapshot = Callable[[int | None], Mapping[str, Any]]


class EvidenceError(RuntimeError):
    """The evidence directory cannot be used safely; the message says why and what to fix."""


@dataclass(frozen=True)
class EvidenceRequest:
    """What a bundle is for: the episode (its findings are the first part) and why."""

    node: str
    episode_id: int
    fault_class: str
    target: str
    occasion: str  # "rma" or "needs_human"
    findings: Mapping[str, Any] = field(default_factory=dict)  # the episode's evidence
    ticket_id: int | None = None
    fault_at: dt.datetime | None = None  # when the episode opened: the kernel log's centre

    @property
    def gpu(self) -> int | None:
        """The faulty GPU's NVML index, for a GPU fault on one GPU."""
        if self.fault_class.startswith("gpu.") and self.target.isdigit():
            return int(self.target)
        return None


@dataclass(frozen=True)
class EvidenceSources:
    """Where the parts come from. `sys_root` is the host's /sys (a fixture tree in tests);
    None for a callable means the node has no such source (no GPU plumbing)."""

    sys_root: Path
    kernel_log: KernelLog | None = None
    nvml: NvmlSnapshot | None = None


@dataclass(frozen=True)
class PartOutcome:
    name: str  # the member's name in the tar
    ok: bool
    seconds: float
    bytes: int = 0  # bytes kept in the bundle
    note: str = ""  # why it failed, was cut or left out

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Bundle:
    """A written bundle, as a ticket and an event name it."""

    path: Path
    sha256: str
    bytes: int
    parts: tuple[PartOutcome, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "bytes": self.bytes,
            "parts": {p.name: ("ok" if p.ok else p.note) for p in self.parts},
        }


def evidence_dir(state_dir: Path) -> Path:
    """`<state_dir>/evidence`, created 0700 if missing; refuses a symlink, a non-directory
    or one owned by another user (someone could then swap files under us)."""
    path = state_dir / EVIDENCE_DIR
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise EvidenceError(f"{path} is not a plain directory; remove it and Medic makes it")
    if info.st_uid != os.geteuid():
        raise EvidenceError(f"{path} is owned by uid {info.st_uid}; chown it to {os.geteuid()}")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700, follow_symlinks=False)
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, sha256: str) -> bool:
    """True when the bundle at `path` is still what was recorded."""
    try:
        return sha256_of(path) == sha256
    except OSError:
        return False


def _timed(name: str, timeout: float, read: Callable[[], bytes]) -> tuple[bytes | None, str]:
    """Run `read` on a thread with a deadline: (its bytes, "") or (None, why). A read that
    hangs (NVML inside a wedged driver) is left behind on its daemon thread."""
    box: list[bytes] = []
    error: list[str] = []

    def run() -> None:
        try:
            box.append(read())
        except Exception as exc:
            error.append(f"{type(exc).__name__}: {exc}"[:300])

    thread = threading.Thread(target=run, name=f"evidence-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return None, f"timed out after {timeout:g}s"
    if error:
        return None, error[0]
    return box[0], ""


def hca_counters(sys_root: Path) -> dict[str, Any]:
    """Every InfiniBand port's state and counters: {hca: {port: {file: text}}} from
    `<sys>/class/infiniband/*/ports/*/{state,phys_state,rate,counters/*,hw_counters/*}`."""
    base = sys_root / "class/infiniband"
    found: dict[str, Any] = {}
    files = 0
    if not base.is_dir():
        return found
    for hca in sorted(base.iterdir()):
        ports = hca / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir()):
            values: dict[str, str] = {}
            candidates = [port / n for n in ("state", "phys_state", "rate", "link_layer")]
            for sub in ("counters", "hw_counters"):
                if (port / sub).is_dir():
                    candidates += sorted((port / sub).iterdir())
            for path in candidates:
                if files >= HCA_MAX_FILES:
                    break
                with contextlib.suppress(OSError):
                    with path.open("rb") as stream:
                        text = stream.read(HCA_FILE_BYTES).decode("utf-8", errors="replace")
                    name = path.name if path.parent == port else f"{path.parent.name}/{path.name}"
                    values[name] = text.strip()
                    files += 1
            found.setdefault(hca.name, {})[port.name] = values
    return found


def _bug_report_argv(settings: EvidenceSettings) -> tuple[str, ...] | None:
    """The report command with its program resolved on PATH, or None when not installed."""
    program = settings.bug_report[0] if settings.bug_report else ""
    if not program:
        return None
    resolved = program if os.path.isabs(program) else shutil.which(program)
    if resolved is None or not os.access(resolved, os.X_OK):
        return None
    return (resolved, *settings.bug_report[1:])


def _bug_report(settings: EvidenceSettings, work: Path, room: int) -> tuple[bytes | None, str]:
    """Run nvidia-bug-report.sh into the private `work` dir; its report (a .gz the script
    writes beside --output-file) as bytes, cut to `room`."""
    if not settings.bug_report:
        return None, "switched off: bug_report = []"
    argv = _bug_report_argv(settings)
    if argv is None:
        return None, f"{settings.bug_report[0]}: not installed"
    out = work / "nvidia-bug-report.log"
    result = proc.run_capped(
        (*argv, "--output-file", str(out)),
        timeout=settings.bug_report_timeout,
        limit=64 << 10,
        cwd=work,
    )
    if not result.ok:
        return None, result.describe_failure()
    for candidate in (out.with_name(out.name + ".gz"), out):
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as stream:
            data = stream.read(room + 1)
        if len(data) > room:
            return None, f"report larger than the {room} bytes left under max_bytes"
        return data, ""
    return None, "the command wrote no report"


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True, default=str).encode()


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def bundle_name(request: EvidenceRequest, at: dt.datetime) -> str:
    node = _SAFE.sub("_", request.node)[:64] or "node"
    return f"{node}-episode{request.episode_id}-{request.occasion}-{at:%Y%m%dT%H%M%SZ}"


def collect(
    request: EvidenceRequest,
    sources: EvidenceSources,
    settings: EvidenceSettings,
    state_dir: Path,
    *,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
) -> Bundle:
    """Gather every part (each with its deadline), write the bundle and its checksum, then
    prune old bundles. Raises EvidenceError or OSError only when nothing could be written."""
    directory = evidence_dir(state_dir)
    started = now()
    members: list[tuple[str, bytes]] = []
    outcomes: list[PartOutcome] = []
    room = settings.max_bytes

    def add(name: str, read: Callable[[], bytes], timeout: float) -> None:
        nonlocal room
        clock = time.monotonic()
        data, note = _timed(name, timeout, read)
        seconds = round(time.monotonic() - clock, 3)
        if data is not None and len(data) > room:
            note = f"{len(data)} bytes: over the {room} bytes left under max_bytes"
            data = None
        if data is None:
            outcomes.append(PartOutcome(name, False, seconds, 0, note))
            return
        room -= len(data)
        members.append((name, data))
        outcomes.append(PartOutcome(name, True, seconds, len(data)))

    add("findings.json", lambda: _json_bytes(dict(request.findings)), settings.part_timeout)
    kernel_log = sources.kernel_log
    if kernel_log is not None:
        add("kernel.log", lambda: kernel_log(request.fault_at).encode(), settings.part_timeout)
    else:
        outcomes.append(PartOutcome("kernel.log", False, 0.0, 0, "no kernel log on this node"))
    nvml = sources.nvml
    if nvml is not None:
        add("nvml.json", lambda: _json_bytes(dict(nvml(request.gpu))), settings.part_timeout)
    else:
        outcomes.append(PartOutcome("nvml.json", False, 0.0, 0, "no NVML on this node"))
    add("hca.json", lambda: _json_bytes(hca_counters(sources.sys_root)), settings.part_timeout)
    work = Path(tempfile.mkdtemp(prefix=".bug-report-", dir=directory))
    try:
        clock = time.monotonic()
        report, note = _bug_report(settings, work, room)
        seconds = round(time.monotonic() - clock, 3)
        if report is None:
            outcomes.append(PartOutcome("nvidia-bug-report.log.gz", False, seconds, 0, note))
        else:
            room -= len(report)
            members.append(("nvidia-bug-report.log.gz", report))
            outcomes.append(PartOutcome("nvidia-bug-report.log.gz", True, seconds, len(report)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    manifest = {
        "node": request.node,
        "episode": request.episode_id,
        "ticket": request.ticket_id,
        "occasion": request.occasion,
        "fault_class": request.fault_class,
        "target": request.target,
        "fault_at": request.fault_at.isoformat() if request.fault_at else None,
        "collected_at": started.isoformat(),
        "parts": [o.as_dict() for o in outcomes],
        "left_out": "core dumps, job data, other nodes' logs, firmware dumps",
    }
    members.insert(0, ("manifest.json", _json_bytes(manifest)))
    path, digest = _write(directory, bundle_name(request, started), members, started)
    bundle = Bundle(path, digest, os.lstat(path).st_size, tuple(outcomes))
    prune(directory, settings, now(), keep=path)
    return bundle


def _write_new(directory: Path, name: str, data: bytes) -> None:
    fd = os.open(
        directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    with os.fdopen(fd, "wb") as stream:
        stream.write(data)


def _write(
    directory: Path, stem: str, members: list[tuple[str, bytes]], at: dt.datetime
) -> tuple[Path, str]:
    """The tar.gz written under a private name, then linked to its final name, and its
    checksum beside it: (the bundle, its sha256). Linking and O_EXCL fail on anything
    already there, a planted symlink included: it is never followed or replaced, and the
    next name whose bundle and checksum are both free is taken instead."""
    partial = directory / f".{stem}.{os.getpid()}.{threading.get_ident()}{PARTIAL}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(partial, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as stream, tarfile.open(fileobj=stream, mode="w:gz") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = int(at.timestamp())
                info.mode = 0o600
                tar.addfile(info, io.BytesIO(data))
        for n in range(100):
            final = directory / (stem + (f"-{n}" if n else "") + SUFFIX)
            try:
                os.link(partial, final, follow_symlinks=False)
            except FileExistsError:
                continue
            digest = sha256_of(final)
            try:
                _write_new(directory, final.name + ".sha256", f"{digest}  {final.name}\n".encode())
            except FileExistsError:
                os.unlink(final)
                continue
            return final, digest
        raise EvidenceError(f"{directory}: 100 bundles named {stem}*; prune the directory")
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def prune(
    directory: Path, settings: EvidenceSettings, now: dt.datetime, *, keep: Path | None = None
) -> list[Path]:
    """Remove bundles older than keep_days, then the oldest past keep_bundles (never
    `keep`), with their checksum files; and leftovers of an interrupted collection older
    than a day. Returns the bundles removed."""
    horizon = now.timestamp() - settings.keep_days * 86400
    bundles: list[tuple[float, Path]] = []
    for entry in os.scandir(directory):
        info = entry.stat(follow_symlinks=False)
        path = directory / entry.name
        if entry.name.startswith(".") and info.st_mtime < now.timestamp() - 86400:
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        elif entry.name.endswith(SUFFIX) and stat.S_ISREG(info.st_mode):
            bundles.append((info.st_mtime, path))
    bundles.sort()
    kept_apart = [path for _, path in bundles if path == keep]
    others = [(mtime, path) for mtime, path in bundles if path != keep]
    room = settings.keep_bundles - len(kept_apart)  # the bundle just written counts first
    doomed = [path for mtime, path in others if mtime < horizon]
    young = [path for mtime, path in others if mtime >= horizon]
    doomed += young[: max(0, len(young) - room)]  # the oldest past the count
    removed: list[Path] = []
    for path in doomed:
        for gone in (path, path.with_name(path.name + ".sha256")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(gone)
        removed.append(path)
    return removed


class EvidenceCollector:
    """Collects bundles on background threads, one at a time per node, and tells `done`
    (the ticket or the event that names the bundle) when each is written."""

    def __init__(
        self,
        settings: Callable[[], EvidenceSettings],
        sources: Callable[[], EvidenceSources],
        state_dir: Callable[[], Path],
        done: Callable[[EvidenceRequest, Bundle | None, str], object],
    ) -> None:
        self.settings = settings
        self.sources = sources
        self.state_dir = state_dir
        self.done = done
        self._lock = threading.Lock()  # one collection at a time: bug reports are heavy
        self.threads: list[threading.Thread] = []

    def start(self, request: EvidenceRequest) -> threading.Thread | None:
        """Begin a collection; returns its thread, or None when evidence is switched off.
        Never raises: a failure is logged and told to `done`."""
        try:
            if not self.settings().enabled:
                return None
        except Exception as exc:
            log.warning("%s: no evidence bundle: %s", request.node, exc)
            return None
        thread = threading.Thread(target=self._run, args=(request,), name="evidence", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had: the ladder goes on without
            log.warning("%s: no evidence bundle: %s", request.node, exc)
            return None
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        return thread

    def _run(self, request: EvidenceRequest) -> None:
        with self._lock:
            try:
                bundle = collect(request, self.sources(), self.settings(), self.state_dir())
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("%s: evidence bundle not written: %s", request.node, why)
                self._tell(request, None, why)
                return
            log.info("%s: evidence bundle %s (%d bytes)", request.node, bundle.path, bundle.bytes)
            self._tell(request, bundle, "")

    def _tell(self, request: EvidenceRequest, bundle: Bundle | None, why: str) -> None:
        try:
            self.done(request, bundle, why)
        except Exception:
            log.exception("%s: could not record evidence bundle", request.node)


__all__ = [
    "Bundle",
    "EvidenceCollector",
    "EvidenceError",
    "EvidenceRequest",
    "EvidenceSources",
    "PartOutcome",
    "bundle_name",
    "collect",
    "evidence_dir",
    "hca_counters",
    "prune",
    "sha256_of",
    "verify",
]
