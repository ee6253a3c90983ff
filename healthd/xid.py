"""NVIDIA XIDs: the catalog (what each XID means and what to do), the kernel log format the
driver prints them in, and the in-memory buffer of recent XIDs that the listener and the
kernel log feed and the `gpu_xid` check reads.

The catalog is data (xid_catalog.json, quoted from NVIDIA's Xid Catalog), validated when
this module is imported, so a bad entry stops the daemon at start-up with the entry named.
Each XID has NVIDIA's resolution bucket; the bucket decides Medic's recommendation and
status (RESTART_APP/IGNORE never drain: RESTART_APP recommends `restart_app`, the job whose
application the XID hit restarts and the node stays in service; IGNORE is history). An entry
may name a `follow_up`: what to do once the immediate action is done (XID 94: reset the GPU
when it is idle, as the catalog's trigger text advises).
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from healthd.checks.base import Status
from healthd.kmsg import KmsgRecord
from medic_core.vocabulary import RECOMMENDATION_WORDS

CATALOG_FILE = "xid_catalog.json"
RECOMMENDATIONS: tuple[str, ...] = RECOMMENDATION_WORDS  # the one vocabulary, no second list
ENTRY_STATUSES = (Status.OK, Status.WARN, Status.CRITICAL)
UNKNOWN_BUCKET = "UNKNOWN"
_ENTRY_KEYS = frozenset(
    {
        "xid",
        "mnemonic",
        "description",
        "bucket",
        "investigatory",
        "applies_to",
        "severity",
        "quoted",
        "note",
        "recommendation",
        "follow_up",
    }
)
_REQUIRED = ("xid", "mnemonic", "description", "bucket", "severity")


# XIDs of the GPU's memory (48 DBE, 63/64 row remap, 94/95 contained/uncontained, 140 ECC
# escape): what they leave behind, a pending row remap or a retired page, is measured at once
# by its own checks (the daemon re-runs them on such an XID), so a reset the XID's immediate
# action does not ask for is still seen.
MEMORY_XIDS = frozenset({48, 63, 64, 94, 95, 140})
MEMORY_CHECKS = ("gpu_remapped_rows", "gpu_retired_pages")


class CatalogError(ValueError):
    """The XID catalog is invalid; the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class BucketRule:
    name: str
    recommendation: str
    status: Status
    meaning: str
    inferred: bool  # Medic's reading of the bucket, not NVIDIA's words


@dataclass(frozen=True)
class XidEntry:
    xid: int
    mnemonic: str
    description: str
    bucket: str  # NVIDIA's resolution bucket (immediate action)
    investigatory: str
    severity: Status  # what Medic reports: OK (event only), WARN or CRITICAL
    recommendation: str  # one of RECOMMENDATIONS
    applies_to: tuple[str, ...]
    quoted: bool  # mnemonic/description/bucket quoted from the catalog
    note: str = ""
    follow_up: str = ""  # a recommendation for after the immediate one ("" when none)

    @property
    def fault_class(self) -> str:
        return f"gpu.xid.{self.xid}"

    @property
    def drains(self) -> bool:
        return self.severity == Status.CRITICAL


@dataclass(frozen=True)
class XidCatalog:
    source: str
    version: str
    buckets: Mapping[str, BucketRule]
    entries: Mapping[int, XidEntry]

    def lookup(self, xid: int) -> XidEntry:
        """The entry for `xid`; an XID the catalog lacks is WARN with bucket UNKNOWN."""
        found = self.entries.get(xid)
        if found is not None:
            return found
        rule = self.buckets[UNKNOWN_BUCKET]
        return XidEntry(
            xid=xid,
            mnemonic="UNKNOWN",
            description=f"XID {xid} is not in Medic's catalog",
            bucket=UNKNOWN_BUCKET,
            investigatory="",
            severity=rule.status,
            recommendation=rule.recommendation,
            applies_to=(),
            quoted=False,
        )


def _fail(origin: str, where: str, problem: str, fix: str) -> CatalogError:
    return CatalogError(f"{origin}: {where}: {problem}; {fix}")


def _status(value: Any, origin: str, where: str) -> Status:
    try:
        status = Status(value)
    except ValueError:
        status = None
    if status not in ENTRY_STATUSES:
        names = ", ".join(s.value for s in ENTRY_STATUSES)
        raise _fail(origin, where, f"status {value!r} is not allowed", f"use one of: {names}")
    assert status is not None
    return status


def _recommendation(value: Any, origin: str, where: str) -> str:
    if value not in RECOMMENDATIONS:
        raise _fail(
            origin,
            where,
            f"recommendation {value!r} is unknown",
            f"use one of: {', '.join(RECOMMENDATIONS)}",
        )
    return str(value)


def _bucket(name: str, raw: Any, origin: str) -> BucketRule:
    where = f"bucket {name}"
    if not isinstance(raw, Mapping):
        raise _fail(origin, where, "expected an object", "write {recommendation, status, ...}")
    return BucketRule(
        name=name,
        recommendation=_recommendation(raw.get("recommendation"), origin, where),
        status=_status(raw.get("status"), origin, where),
        meaning=str(raw.get("meaning", "")),
        inferred=bool(raw.get("inferred", True)),
    )


def _entry(index: int, raw: Any, buckets: Mapping[str, BucketRule], origin: str) -> XidEntry:
    label = f"entry {index}"
    if not isinstance(raw, Mapping):
        raise _fail(origin, label, "expected an object", "write {xid, mnemonic, ...}")
    if isinstance(raw.get("xid"), int):
        label = f"entry {index} (XID {raw['xid']})"
    unknown = set(raw) - _ENTRY_KEYS
    if unknown:
        raise _fail(
            origin,
            label,
            f"unknown keys {sorted(unknown)}",
            f"use: {', '.join(sorted(_ENTRY_KEYS))}",
        )
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise _fail(origin, label, f"missing {', '.join(missing)}", "add them")
    xid = raw["xid"]
    if not isinstance(xid, int) or isinstance(xid, bool) or xid <= 0:
        raise _fail(origin, label, f"xid {xid!r} is not a positive integer", "fix the number")
    bucket = raw["bucket"]
    if bucket not in buckets:
        raise _fail(
            origin, label, f"bucket {bucket!r} is not defined", "add it to buckets or fix it"
        )
    for key in ("mnemonic", "description"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise _fail(origin, label, f"{key} is empty or not a string", f"give a {key}")
    applies = raw.get("applies_to", [])
    if not isinstance(applies, list) or not all(isinstance(a, str) for a in applies):
        raise _fail(origin, label, "applies_to is not a list of strings", "fix applies_to")
    rule = buckets[bucket]
    recommendation = raw.get("recommendation", rule.recommendation)
    follow_up = raw.get("follow_up")
    return XidEntry(
        xid=xid,
        mnemonic=raw["mnemonic"],
        description=raw["description"],
        bucket=bucket,
        investigatory=str(raw.get("investigatory", "")),
        severity=_status(raw["severity"], origin, label),
        recommendation=_recommendation(recommendation, origin, label),
        applies_to=tuple(applies),
        quoted=bool(raw.get("quoted", False)),
        note=str(raw.get("note", "")),
        follow_up="" if follow_up is None else _recommendation(follow_up, origin, label),
    )


def parse_catalog(data: Any, origin: str = CATALOG_FILE) -> XidCatalog:
    if not isinstance(data, Mapping):
        raise _fail(origin, "-", "expected a JSON object", "see the shipped catalog")
    for key in ("source", "catalog_version", "buckets", "entries"):
        if key not in data:
            raise _fail(origin, key, "missing", "add it")
    raw_buckets = data["buckets"]
    if not isinstance(raw_buckets, Mapping) or UNKNOWN_BUCKET not in raw_buckets:
        raise _fail(origin, "buckets", f"must be an object with {UNKNOWN_BUCKET}", "add it")
    buckets = {name: _bucket(name, raw, origin) for name, raw in raw_buckets.items()}
    if not isinstance(data["entries"], list):
        raise _fail(origin, "entries", "expected a list", "write a JSON array")
    entries: dict[int, XidEntry] = {}
    for index, raw in enumerate(data["entries"]):
        entry = _entry(index, raw, buckets, origin)
        if entry.xid in entries:
            raise _fail(origin, f"entry {index}", f"XID {entry.xid} listed twice", "keep one")
        entries[entry.xid] = entry
    return XidCatalog(str(data["source"]), str(data["catalog_version"]), buckets, entries)


def load_catalog(text: str | None = None, origin: str = CATALOG_FILE) -> XidCatalog:
    if text is None:
        text = resources.files("healthd").joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(origin, "-", f"not valid JSON ({exc})", "fix the syntax") from exc
    return parse_catalog(data, origin)


CATALOG = load_catalog()


# --- the kernel log -------------------------------------------------------------------------

# NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.
# NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp ...
# NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): ...
# NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, ...
# NVRM: Xid (0000:03:00): 14, Channel 00000001
_XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):"
    r" (?P<xid>\d+)"
    r"(?:, pid=(?P<pid>[^,]*))?"
    r"(?:, name=(?P<name>[^,]*))?"
    r"(?:, (?P<text>.*))?$"
)


@dataclass(frozen=True)
class KernelXid:
    """One NVRM Xid line from the kernel log."""

    xid: int
    pci: str  # the driver's "0000:18:00" (domain:bus:device, no function)
    pid: int | None
    process: str | None
    text: str
    seq: int | None = None
    timestamp_us: int | None = None  # CLOCK_MONOTONIC, as time.monotonic() * 1e6


def parse_xid_message(message: str) -> KernelXid | None:
    match = _XID_LINE.search(message.strip())
    if match is None:
        return None
    pid_text = (match.group("pid") or "").strip("'\"")
    name = match.group("name")
    return KernelXid(
        xid=int(match.group("xid")),
        pci=match.group("pci").lower(),
        pid=int(pid_text) if pid_text.isdigit() else None,
        process=None if name is None or name.strip("'\"") == "<unknown>" else name,
        text=(match.group("text") or "").strip(),
    )


def xids_from_records(records: Iterable[KmsgRecord]) -> list[KernelXid]:
    found = []
    for record in records:
        parsed = parse_xid_message(record.message)
        if parsed is not None:
            found.append(replace(parsed, seq=record.seq, timestamp_us=record.timestamp_us))
    return found


# --- the recent-XID buffer ------------------------------------------------------------------


@dataclass(frozen=True)
class XidRecord:
    seq: int  # assigned by the buffer, increasing
    xid: int
    gpu: int | None  # NVML index; None when the PCI id matched no GPU
    monotonic: float  # CLOCK_MONOTONIC seconds (kernel timestamp or time.monotonic())
    sources: tuple[str, ...]  # "nvml", "kmsg" (both when the two reports were merged)
    pci: str | None = None
    message: str = ""
    pid: int | None = None
    process: str | None = None
    kernel_s: float | None = None  # the kernel log's timestamp, when it logged this XID

    def evidence(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "xid": self.xid,
            "gpu": self.gpu,
            "sources": list(self.sources),
            "pci": self.pci,
            "message": self.message,
            "pid": self.pid,
            "process": self.process,
        }


class XidBuffer:
    """The XIDs seen recently, shared by the listener (writer, its own thread), the kernel
    log reader in the `gpu_xid` check (writer) and that check (reader). Thread-safe.

    The same XID reported by NVML and by the kernel log within `merge_seconds` on the same
    GPU is one record with both sources. Only `maxlen` records are kept. The remediation
    ladder calls `clear(gpu)` after a successful GPU reset so old XIDs stop counting.
    `counts()` counts every record ever added (merges once), by GPU and XID, for the
    metrics: it only grows."""

    def __init__(self, maxlen: int = 4096, merge_seconds: float = 10.0) -> None:
        self._records: deque[XidRecord] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._seq = 0
        self._counts: Counter[tuple[int | None, int]] = Counter()
        self.merge_seconds = merge_seconds

    def add(
        self,
        xid: int,
        gpu: int | None,
        *,
        source: str,
        monotonic: float,
        pci: str | None = None,
        message: str = "",
        pid: int | None = None,
        process: str | None = None,
    ) -> XidRecord:
        with self._lock:
            for i in range(len(self._records) - 1, -1, -1):
                old = self._records[i]
                if abs(old.monotonic - monotonic) > self.merge_seconds:
                    continue
                if old.xid == xid and old.gpu == gpu and source not in old.sources:
                    merged = replace(
                        old,
                        sources=(*old.sources, source),
                        pci=old.pci or pci,
                        message=old.message or message,
                        pid=old.pid if old.pid is not None else pid,
                        process=old.process or process,
                        kernel_s=monotonic if source == "kmsg" else old.kernel_s,
                    )
                    self._records[i] = merged
                    return merged
            self._seq += 1
            kernel_s = monotonic if source == "kmsg" else None
            record = XidRecord(
                self._seq, xid, gpu, monotonic, (source,), pci, message, pid, process, kernel_s
            )
            self._records.append(record)
            self._counts[(gpu, xid)] += 1
            return record

    def records(self) -> tuple[XidRecord, ...]:
        with self._lock:
            return tuple(self._records)

    def counts(self) -> dict[tuple[int | None, int], int]:
        """(GPU, XID) -> records added since the buffer was made; `clear` leaves them."""
        with self._lock:
            return dict(self._counts)

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._seq

    def clear(self, gpu: int | None = None, *, before: float | None = None) -> int:
        """Forget the XIDs of `gpu` (all GPUs when None) seen before `before` (monotonic;
        all when None). Returns how many were dropped."""
        with self._lock:
            keep = [
                r
                for r in self._records
                if not ((gpu is None or r.gpu == gpu) and (before is None or r.monotonic < before))
            ]
            dropped = len(self._records) - len(keep)
            self._records.clear()
            self._records.extend(keep)
            return dropped
