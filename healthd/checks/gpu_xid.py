"""Recent NVIDIA XIDs as conditions, per NVIDIA's Xid Catalog (healthd/xid_catalog.json).

XIDs reach the recent-XID buffer (`GpuContext.xids`) from two sources: the XID listener
(NVML events, delivered at once) and this check's own reading of /dev/kmsg (the driver's
`NVRM: Xid (PCI:...)` lines, mapped to GPU indexes through NVML's PCI bus ids; it also
catches XIDs logged before the daemon started). A report from both is one XID.

An XID whose catalog bucket calls for a GPU reset, reboot or RMA is a CRITICAL condition
for `window_seconds` (or until the remediation ladder clears the GPU's XIDs after a reset).
RESTART_APP XIDs (recommendation `restart_app`: the application they hit must restart, the
node stays in service) are reported once as a WARN event (history) and, on the run that
first sees them (if at most `restart_app_seconds` old), as a WARN condition on their GPU,
so the daemon hands a fresh one to the decision core (requeue the job on that GPU); the
next run clears that condition, and the next such XID raises it again. Evidence `last_seq`
(the buffer's number of the newest XID) tells two such XIDs in consecutive runs apart.
IGNORE XIDs are an OK event (history); an XID missing from the catalog is a WARN event with
bucket UNKNOWN. Neither ever drains.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Kind,
    Result,
    Status,
    Tier,
    bounds,
    register,
    setting,
)
from healthd.checks.gpu_common import gpu_context, gpu_fault, gpu_ok
from healthd.kmsg import read_boot_wall, read_since, wall_time
from healthd.nvml_types import NvmlClient, NvmlError, pci_key
from healthd.xid import CATALOG, XidEntry, XidRecord, xids_from_records
from medic_core.vocabulary import Recommendation

NAME = "gpu_xid"
SAMPLES = 5
_STATUS_WORDS = ("OK", "WARN", "CRITICAL")


@dataclass(frozen=True, kw_only=True)
class GpuXidConfig(CheckConfig):
    window_seconds: float = setting(
        3600.0, minimum=1, doc="how long a CRITICAL XID stays a condition (unless cleared)"
    )
    restart_app_seconds: float = setting(
        120.0,
        minimum=1,
        doc="a RESTART_APP XID older than this is history only, never a restart_app"
        " condition (a fresh reader of the kernel log sees every XID since boot)",
    )
    read_kmsg: bool = setting(True, doc="also read NVRM Xid lines from /dev/kmsg")
    ignore_xids: tuple[int, ...] = setting((), doc="XIDs never reported")
    status_overrides: dict[str, str] = field(
        default_factory=dict,
        metadata=bounds(choices=_STATUS_WORDS, doc='status per XID number, e.g. {"74" = "WARN"}'),
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for key in self.status_overrides:
            if not key.isdigit():
                yield (f"status_overrides.{key}", "is not an XID number", 'use e.g. "74"')


@dataclass(frozen=True)
class GpuXidObservation:
    now: float  # monotonic
    records: tuple[XidRecord, ...]
    reported_through: int  # buffer seq already reported as events by earlier runs
    kmsg_problem: str = ""  # why /dev/kmsg could not be read ("" when it was, or not asked)
    kmsg_xids: int = 0  # XID lines read from the kernel log this run
    boot_wall: float | None = None  # wall time of the kernel log's zero (kmsg.boot_wall)


def status_for(entry: XidEntry, cfg: GpuXidConfig) -> Status:
    override = cfg.status_overrides.get(str(entry.xid))
    return Status(override) if override else entry.severity


def _pci_map(client: NvmlClient) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        count = client.device_count()
    except NvmlError:
        return found
    for index in range(count):
        info = client.cached_gpu_info(index)
        if info is None:
            try:
                info = client.gpu_info(index)
            except NvmlError:
                continue
        found[pci_key(info.pci_bus_id)] = index
    return found


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=30,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.xid.*": Fault(
            (Status.WARN, Status.CRITICAL),
            "an XID on a GPU: CRITICAL condition or WARN event per the XID catalog below",
        )
    },
)
class GpuXidCheck(Check[GpuXidObservation, GpuXidConfig]):
    """Recent XIDs (NVML events and the kernel log), judged by NVIDIA's Xid Catalog."""

    config_type = GpuXidConfig

    def __init__(self) -> None:
        self._kmsg_seq: int | None = None
        self._reported = 0

    def gather(self, ctx: CheckContext, cfg: GpuXidConfig) -> GpuXidObservation:
        gpu = gpu_context(ctx)
        problem, read = "", 0
        if cfg.read_kmsg:
            try:
                batch = read_since(ctx.roots.dev / "kmsg", self._kmsg_seq)
            except OSError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                self._kmsg_seq = batch.last_seq
                found = xids_from_records(batch.records)
                read = len(found)
                pcis = _pci_map(gpu.client) if found else {}
                for x in found:
                    gpu.xids.add(
                        x.xid,
                        pcis.get(pci_key(x.pci)),
                        source="kmsg",
                        monotonic=(x.timestamp_us or 0) / 1e6,
                        pci=x.pci,
                        message=x.text,
                        pid=x.pid,
                        process=x.process,
                    )
        records = gpu.xids.records()
        now = ctx.clock.monotonic()
        boot = read_boot_wall(ctx.clock.monotonic, lambda: ctx.clock.now().timestamp())
        observation = GpuXidObservation(now, records, self._reported, problem, read, boot)
        self._reported = max([self._reported, *(r.seq for r in records)])
        return observation

    @staticmethod
    def evaluate(observation: GpuXidObservation, cfg: GpuXidConfig) -> list[Result]:
        groups: dict[tuple[int | None, int], list[XidRecord]] = {}
        restarts: dict[tuple[int | None, int], list[XidRecord]] = {}
        events: list[Result] = []
        for record in observation.records:
            if record.xid in cfg.ignore_xids:
                continue
            entry = CATALOG.lookup(record.xid)
            status = status_for(entry, cfg)
            if status == Status.CRITICAL:
                if observation.now - record.monotonic <= cfg.window_seconds:
                    groups.setdefault((record.gpu, record.xid), []).append(record)
            elif record.seq > observation.reported_through:
                events.append(_event(record, entry, status, _fault_at(record, observation)))
                if (
                    status == Status.WARN
                    and entry.recommendation == Recommendation.RESTART_APP
                    and observation.now - record.monotonic <= cfg.restart_app_seconds
                ):
                    restarts.setdefault((record.gpu, record.xid), []).append(record)
        conditions = [
            _condition(records, observation, Status.CRITICAL) for records in groups.values()
        ]
        conditions += [
            _condition(records, observation, Status.WARN) for records in restarts.values()
        ]
        if not conditions:
            evidence = {
                "window_seconds": cfg.window_seconds,
                "recent": len(observation.records),
                "kmsg_xids": observation.kmsg_xids,
                "catalog_version": CATALOG.version,
            }
            if observation.kmsg_problem:
                evidence["kmsg_problem"] = observation.kmsg_problem
            conditions.append(
                gpu_ok(
                    NAME,
                    f"no XID needing action in the last {cfg.window_seconds:g}s",
                    target=None,
                    evidence=evidence,
                )
            )
        return conditions + events


def _target(record: XidRecord) -> str | None:
    if record.gpu is not None:
        return str(record.gpu)
    return f"pci:{record.pci}" if record.pci else None


def _describe(entry: XidEntry) -> dict[str, object]:
    follow_up = {"follow_up": entry.follow_up} if entry.follow_up else {}
    return {
        **follow_up,
        "xid": entry.xid,
        "mnemonic": entry.mnemonic,
        "description": entry.description,
        "bucket": entry.bucket,
        "investigatory": entry.investigatory,
        "catalog_quoted": entry.quoted,
        "catalog_version": CATALOG.version,
    }


def _where(record: XidRecord) -> str:
    return f"GPU {record.gpu}" if record.gpu is not None else f"PCI {record.pci or '?'}"


def _fault_at(record: XidRecord, observation: GpuXidObservation) -> dict[str, str]:
    """`fault_at`: when the XID happened, from the kernel log's timestamp of its NVRM line
    (healthd.kmsg.wall_time). NVML's XID events carry no time of their own: an XID only
    NVML reported has none, and `medic report` shows its detection as unknown."""
    if record.kernel_s is None or observation.boot_wall is None:
        return {}
    at = wall_time(round(record.kernel_s * 1e6), observation.boot_wall, observation.now)
    return {} if at is None else {"fault_at": at.isoformat()}


def _condition(records: list[XidRecord], observation: GpuXidObservation, status: Status) -> Result:
    now = observation.now
    last = records[-1]
    entry = CATALOG.lookup(last.xid)
    times = f"{len(records)}x, " if len(records) > 1 else ""
    detail = f": {last.message}" if last.message else ""
    return gpu_fault(
        NAME,
        status,
        entry.fault_class,
        f"{_where(last)}: XID {entry.xid} {entry.description} ({times}last"
        f" {max(0.0, now - last.monotonic):.0f}s ago; NVIDIA: {entry.bucket}){detail}",
        recommendation=entry.recommendation,
        target=_target(last),
        evidence={
            **_describe(entry),
            "count": len(records),
            "last_seq": last.seq,
            "records": [r.evidence() for r in records[-SAMPLES:]],
            **_fault_at(records[0], observation),  # the first XID raised the condition
        },
    )


def _event(record: XidRecord, entry: XidEntry, status: Status, fault_at: dict[str, str]) -> Result:
    detail = f": {record.message}" if record.message else ""
    message = (
        f"{_where(record)}: XID {entry.xid} {entry.description} (NVIDIA: {entry.bucket}){detail}"
    )
    evidence = {**_describe(entry), **record.evidence(), **fault_at}
    if status == Status.OK:
        return Result(
            NAME,
            Status.OK,
            None,
            _target(record),
            message,
            {**evidence, "fault_class": entry.fault_class, "recommendation": entry.recommendation},
            None,
            Kind.EVENT,
        )
    return gpu_fault(
        NAME,
        status,
        entry.fault_class,
        message,
        recommendation=entry.recommendation,
        target=_target(record),
        evidence=evidence,
        kind=Kind.EVENT,
    )
