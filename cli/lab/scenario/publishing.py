"""Publishing a scenario: the file every process using the injection library re-reads, and
the NVRM Xid lines the driver would have printed to the node's kernel log."""

from __future__ import annotations

from pathlib import Path

from cli.lab.scenario.file_format import write_scenario
from cli.lab.scenario.model import NodeScenario, XidEvent

_KMSG_SEQ_BASE = 500_000  # above the fixture tree's own records


def nvrm_xid_line(scenario: NodeScenario, event: XidEvent, timestamp_us: int) -> str:
    """The kernel log record the NVIDIA driver prints for an XID (format as in
    tests/fixtures/kmsg/nvrm_xid.txt)."""
    from healthd.kmsg import format_record

    bus = scenario.gpus[event.gpu].pci_bus_id.lower()  # 00000000:2a:00.0
    pci = "0000:" + bus.split(":", 1)[1].rsplit(".", 1)[0]
    return format_record(
        _KMSG_SEQ_BASE + event.seq,
        f"NVRM: Xid (PCI:{pci}): {event.xid}, pid=0, name=lab, simulated by medic lab",
        level=4,
        timestamp_us=timestamp_us,
    )


def publish(path: Path, kmsg: Path | None, before: NodeScenario, after: NodeScenario) -> None:
    """Write the node's scenario, and append an NVRM Xid line to its kernel log for every
    XID that is new in `after`: the driver logs every XID, so a daemon that starts after
    the event (after a reboot, say) still finds it there. The line is written first, as
    the driver prints it before NVML delivers the event: a daemon woken by the event finds
    the line that dates it (written after, a loaded machine let the event win)."""
    import time

    seen = max((e.seq for e in before.events), default=0)
    new = [e for e in after.events if e.seq > seen]
    if kmsg is not None and new and kmsg.parent.is_dir():
        now_us = int(time.monotonic() * 1e6)
        with kmsg.open("a") as log:
            for event in new:
                log.write(nvrm_xid_line(after, event, now_us))
    write_scenario(path, after)
