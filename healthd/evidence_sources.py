"""The daemon's side of evidence bundles (remediation.evidence): the kernel log around the
fault, read from the same `<host_root>/dev/kmsg` the kernel-log check follows, an NVML
snapshot through the daemon's own client, and the hook the ladder calls on RMA and
needs-human. The bundle is named in the RMA ticket (tickets.attach_bundle) and in an event."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from healthd.kmsg import read_boot_wall, read_since, wall_time
from healthd.ladder_host import HealthDaemon
from medic_core.config import MedicConfig
from medic_core.settings import EvidenceSettings
from remediation import episodes as ep
from remediation.evidence import (
    Bundle,
    EvidenceCollector,
    EvidenceRequest,
    EvidenceSources,
)
from remediation.ladder import Ladder

log = logging.getLogger("medic.healthd.evidence")

KERNEL_LOG_BEFORE = 600.0  # seconds of kernel log kept before the episode opened
KERNEL_LOG_LINES = 5000  # the newest lines kept at most
KERNEL_LOG_FALLBACK = 500  # lines kept when no record's time can be placed
ACTOR = "medic-ladder"


class EvidenceDaemon(HealthDaemon, Protocol):
    @property
    def config(self) -> MedicConfig: ...


def kernel_log_reader(daemon: HealthDaemon) -> Callable[[dt.datetime | None], str]:
    """The kernel log from KERNEL_LOG_BEFORE seconds before `fault_at` to now; when no record
    can be placed in wall time (a fixture's log, a clock jump), the last lines."""

    def read(fault_at: dt.datetime | None) -> str:
        batch = read_since(daemon.ctx.roots.dev / "kmsg")
        monotonic = time.monotonic()
        boot = read_boot_wall(time.monotonic, time.time)
        lines: list[tuple[dt.datetime | None, str]] = []
        for record in batch.records:
            at = wall_time(record.timestamp_us, boot, monotonic)
            stamp = at.isoformat() if at else f"{record.timestamp_us / 1e6:.6f}s"
            lines.append((at, f"[{stamp}] <{record.level}> {record.message}"))
        since = fault_at.timestamp() - KERNEL_LOG_BEFORE if fault_at else None
        around = [t for at, t in lines if since is not None and at and at.timestamp() >= since]
        head = f"# kernel log from {batch.records[0].seq if batch.records else '-'}"
        if around:
            kept = around[-KERNEL_LOG_LINES:]
            head += f"; {len(kept)} lines from {KERNEL_LOG_BEFORE:g}s before the fault"
        else:
            kept = [t for _, t in lines][-KERNEL_LOG_FALLBACK:]
            head += f"; no line placed near the fault: the last {len(kept)} lines"
        if batch.lost:
            head += f"; {batch.lost} records overwritten before they were read"
        return "\n".join([head, *kept]) + "\n"

    return read


def _as_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple | list):
        return [_as_json(v) for v in value]
    return value


def nvml_reader(daemon: HealthDaemon) -> Callable[[int | None], dict[str, Any]] | None:
    """What the daemon's NVML client reads of the faulty GPU (every GPU when the fault names
    none); each field's error is recorded in its place."""
    plumbing = daemon.gpu
    if plumbing is None:
        return None
    client = plumbing.client

    def snapshot(gpu: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            out["driver_version"] = client.driver_version()
            indexes = [gpu] if gpu is not None else list(range(client.device_count()))
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}
        reads: dict[str, Callable[[int], Any]] = {
            "info": lambda i: client.gpu_info(i, refresh=True),
            "ecc": client.ecc_counts,
            "retired_pages": client.retired_pages,
            "remapped_rows": client.remapped_rows,
            "nvlink": client.nvlink_states,
            "pcie": client.pcie_link,
            "thermal": client.thermal,
            "memory": client.memory,
            "processes": client.processes,
            "utilization": client.utilization,
            "trend_counters": client.trend_counters,
        }
        for index in indexes:
            fields: dict[str, Any] = {}
            for name, read in reads.items():
                try:
                    fields[name] = _as_json(read(index))
                except Exception as exc:
                    fields[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            out[str(index)] = fields
        return out

    return snapshot


def attach_evidence(daemon: EvidenceDaemon, ladder: Ladder) -> EvidenceCollector:
    """Give the ladder its evidence hook, `[remediation.evidence]` read at each bundle."""

    def settings() -> EvidenceSettings:
        return EvidenceSettings.from_config(daemon.config)

    def sources() -> EvidenceSources:
        return EvidenceSources(
            sys_root=daemon.ctx.roots.sys,
            kernel_log=kernel_log_reader(daemon),
            nvml=nvml_reader(daemon),
        )

    def done(request: EvidenceRequest, bundle: Bundle | None, why: str) -> None:
        from remediation.tickets import attach_bundle

        record = bundle.as_dict() if bundle is not None else {"error": why}
        if request.ticket_id is not None:
            attach_bundle(daemon.store, request.ticket_id, record, ACTOR)
        if bundle is not None:
            message = f"evidence bundle {bundle.path} sha256 {bundle.sha256} ({request.occasion})"
        else:
            message = f"evidence bundle not written ({request.occasion}): {why}"
        ladder.host.event(
            message,
            severity="INFO" if bundle is not None else "WARN",
            fault_class=request.fault_class,
            target=request.target,
        )

    collector = EvidenceCollector(settings, sources, lambda: daemon.config.paths.state_dir, done)

    def start(occasion: str, episode: ep.Episode) -> None:
        request = EvidenceRequest(
            node=daemon.node,
            episode_id=episode.id,
            fault_class=episode.fault_class,
            target=episode.target,
            occasion=occasion,
            findings=dict(episode.evidence),
            ticket_id=episode.ticket_id,
            fault_at=episode.opened_at,
        )
        collector.start(request)  # never raises: the ladder goes on whatever happens here

    ladder.evidence = start
    return collector
