"""InfiniBand loopback bandwidth: perftest's `ib_write_bw` server and client on this node,
against one HCA at a time.

The server (`ib_write_bw -d <hca> -i <port> -p <tcp port> ...`) is started first and waits;
the client (same arguments plus the server's address, 127.0.0.1) connects over TCP to
exchange queue-pair details, then RDMA-writes through the HCA and back into it. Both print
the same table after a banner:

     #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
     65536      5000             44326.24            44276.64                  0.708426

With `--report_gbits` the columns read `BW peak[Gb/sec]` and `BW average[Gb/sec]`. perftest's
MB is 2^20 bytes (`format_factor = 0x100000`) and its Gb is 10^9 bits, so both convert to
Gb/s exactly. The average of the largest message size is compared with a fraction of the
port's own rate from sysfs (`400 Gb/sec (4X NDR)`), or an absolute floor.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from healthd.checks.base import (
    Check,
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
from healthd.checks.deep_common import (
    DeepToolConfig,
    command_failed,
    deep_fault,
    find_tool,
    run_evidence,
    tool_absent,
)
from healthd.checks.ib import CLASS_DIR, parse_rate_gbps, parse_state
from healthd.hostfs import list_dir, read_value
from medic_core.proc import CommandResult

NAME = "deep_ib"
TOOL = "ib_write_bw"
MIB = 1 << 20

_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(MB|Gb)/sec\]\s+BW average\[(?:MB|Gb)/sec\]")
_DEVICE = re.compile(r"Device\s*:\s*(\S+)")
_LINK = re.compile(r"Link type\s*:\s*(\S+)")


@dataclass(frozen=True, kw_only=True)
class DeepIbConfig(DeepToolConfig):
    hcas: tuple[str, ...] = setting(
        (), doc="HCAs to test; default: every HCA whose port is ACTIVE on a watched link layer"
    )
    ib_port: int = setting(1, minimum=1, maximum=2, doc="HCA port to test (-i)")
    link_layers: tuple[str, ...] = setting(
        ("InfiniBand",), choices=("InfiniBand", "Ethernet"), doc="link layers to test"
    )
    message_size: int = setting(65536, minimum=2, doc="bytes per RDMA write (-s)")
    iterations: int = setting(5000, minimum=5, doc="writes per run (-n)")
    tcp_port: int = setting(
        18515, minimum=1024, maximum=65000, doc="first TCP port for the QP exchange (-p)"
    )
    server_address: str = setting("127.0.0.1", doc="where the client finds the server")
    report_gbits: bool = setting(True, doc="ask for Gb/sec (--report_gbits)")
    connect_attempts: int = setting(
        10, minimum=1, doc="client attempts while the server is still starting"
    )
    retry_delay: float = setting(0.5, minimum=0.05, doc="seconds between client attempts")
    command_timeout: float = setting(
        60.0, minimum=1, doc="seconds each ib_write_bw may run before it is killed"
    )
    min_fraction_of_rate: float = setting(
        0.8, minimum=0, maximum=1, doc="floor as a fraction of the port's rate; 0 = off"
    )
    min_gbps: float = setting(0.0, minimum=0, doc="absolute floor in Gb/s; 0 = off")


@dataclass(frozen=True)
class PerftestRow:
    size: int
    iterations: int
    bw_peak: float  # in `unit`; 0.00 when perftest did not measure a peak (-D runs)
    bw_average: float
    msg_rate_mpps: float | None


@dataclass(frozen=True)
class PerftestBw:
    unit: str  # "MB/sec" or "Gb/sec"
    rows: tuple[PerftestRow, ...]
    device: str | None = None
    link_type: str | None = None

    def gbps(self, value: float) -> float:
        return value * MIB * 8 / 1e9 if self.unit == "MB/sec" else value

    @property
    def largest(self) -> PerftestRow:
        return max(self.rows, key=lambda r: r.size)


@dataclass(frozen=True)
class HcaRun:
    hca: str
    port: int
    rate: str | None  # the port's sysfs rate, e.g. "400 Gb/sec (4X NDR)"
    client: CommandResult | None = None
    server: CommandResult | None = None
    result: PerftestBw | None = None
    parse_error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.hca}/{self.port}"


@dataclass(frozen=True)
class DeepIbObservation:
    tool: str | None
    runs: tuple[HcaRun, ...] = ()


def parse_perftest_bw(text: str) -> PerftestBw:
    """ib_write_bw (or any perftest *_bw) output -> PerftestBw. Raises ValueError when the
    result table is missing (the server's side before a client connected, say)."""
    unit: str | None = None
    rows: list[PerftestRow] = []
    device = link = None
    for line in text.splitlines():
        if device is None and (match := _DEVICE.search(line)):
            device = match.group(1)
        if link is None and (match := _LINK.search(line)):
            link = match.group(1)
        if match := _HEADER.search(line):
            unit = f"{match.group(1)}/sec"
            continue
        words = line.split()
        if unit is None or len(words) < 4 or not words[0].isdigit():
            continue
        rows.append(
            PerftestRow(
                int(words[0]),
                int(words[1]),
                float(words[2]),
                float(words[3]),
                float(words[4]) if len(words) > 4 else None,
            )
        )
    if unit is None or not rows:
        raise ValueError("no '#bytes #iterations BW peak ...' result table in the output")
    return PerftestBw(unit, tuple(rows), device, link)


def _active_hcas(ctx: CheckContext, cfg: DeepIbConfig) -> list[tuple[str, str | None]]:
    root = ctx.roots.root
    found = []
    for hca in cfg.hcas or list_dir(root, CLASS_DIR) or []:
        base = f"{CLASS_DIR}/{hca}/ports/{cfg.ib_port}"
        try:
            state = parse_state(read_value(root, f"{base}/state"))
            layer = read_value(root, f"{base}/link_layer")
            rate = read_value(root, f"{base}/rate")
        except OSError:
            state, layer, rate = None, None, None
        named = bool(cfg.hcas)  # an HCA named in the config is tested whatever sysfs says
        if named or (state and state[1] == "ACTIVE" and (layer or "") in cfg.link_layers):
            found.append((hca, rate))
    return found


@register(
    name=NAME,
    tiers=(Tier.DEEP,),
    interval=86400,
    timeout=600,
    needs=("host", "commands"),
    faults={
        "ib.loopback.bw": Fault(
            Status.CRITICAL,
            "loopback RDMA write bandwidth below the floor for the port rate",
            "drain",
        ),
        "check.command_failed": Fault(
            Status.UNKNOWN, "the tool failed, timed out or printed nothing parseable"
        ),
    },
)
class DeepIbCheck(Check[DeepIbObservation, DeepIbConfig]):
    """InfiniBand loopback RDMA write bandwidth per HCA (perftest ib_write_bw)."""

    config_type = DeepIbConfig

    def gather(self, ctx: CheckContext, cfg: DeepIbConfig) -> DeepIbObservation:
        tool = find_tool((TOOL,), cfg.search_dirs)
        if tool is None:
            return DeepIbObservation(None)
        runs = []
        for number, (hca, rate) in enumerate(_active_hcas(ctx, cfg)):
            runs.append(_loopback(ctx, cfg, tool, hca, rate, cfg.tcp_port + number))
        return DeepIbObservation(tool, tuple(runs))

    @staticmethod
    def evaluate(observation: DeepIbObservation, cfg: DeepIbConfig) -> list[Result]:
        if observation.tool is None:
            return [tool_absent(NAME, TOOL, cfg.search_dirs)]
        if not observation.runs:
            return [
                not_applicable(
                    NAME,
                    "no ACTIVE InfiniBand port to test",
                    {"link_layers": list(cfg.link_layers), "ib_port": cfg.ib_port},
                )
            ]
        return [_judge(run, cfg) for run in observation.runs]


def _loopback(
    ctx: CheckContext, cfg: DeepIbConfig, tool: str, hca: str, rate: str | None, tcp_port: int
) -> HcaRun:
    common = [
        tool,
        "-d",
        hca,
        "-i",
        str(cfg.ib_port),
        "-p",
        str(tcp_port),
        "-s",
        str(cfg.message_size),
        "-n",
        str(cfg.iterations),
        "-F",
    ]
    if cfg.report_gbits:
        common.append("--report_gbits")
    server: list[CommandResult] = []
    thread = threading.Thread(
        target=lambda: server.append(ctx.commands(common, timeout=cfg.command_timeout)),
        name=f"{NAME}-server-{hca}",
        daemon=True,
    )
    thread.start()
    pause = threading.Event()
    client: CommandResult | None = None
    for _attempt in range(cfg.connect_attempts):
        pause.wait(cfg.retry_delay)  # the server needs a moment to listen
        client = ctx.commands([*common, cfg.server_address], timeout=cfg.command_timeout)
        if client.ok or client.timed_out or not thread.is_alive():
            break
    thread.join(cfg.command_timeout + 1.0)
    server_run = server[0] if server else None
    for source in (client, server_run):
        if source is None or source.timed_out:
            continue
        try:
            return HcaRun(
                hca, cfg.ib_port, rate, client, server_run, parse_perftest_bw(source.stdout)
            )
        except ValueError:
            continue
    return HcaRun(hca, cfg.ib_port, rate, client, server_run, parse_error="no result table")


def _judge(run: HcaRun, cfg: DeepIbConfig) -> Result:
    if run.result is None:
        failed = run.client if run.client is not None and not run.client.ok else run.server
        why = None if failed is not None and not failed.ok else run.parse_error
        return command_failed(NAME, f"{TOOL} loopback on {run.key}", failed, why, target=run.key)
    bw = run.result
    row = bw.largest
    average = bw.gbps(row.bw_average)
    rate = parse_rate_gbps(run.rate)
    floors = [cfg.min_gbps] if cfg.min_gbps else []
    if rate is not None and cfg.min_fraction_of_rate:
        floors.append(rate * cfg.min_fraction_of_rate)
    floor = max(floors) if floors else None
    evidence = {
        "hca": run.hca,
        "port": run.port,
        "rate": run.rate,
        "message_size": row.size,
        "iterations": row.iterations,
        "bw_average_gbps": round(average, 2),
        "bw_peak_gbps": round(bw.gbps(row.bw_peak), 2),
        "msg_rate_mpps": row.msg_rate_mpps,
        "unit": bw.unit,
        "min_gbps": None if floor is None else round(floor, 2),
        **run_evidence(run.client),
    }
    if floor is not None and average < floor:
        return deep_fault(
            NAME,
            Status.CRITICAL,
            "ib.loopback.bw",
            f"{run.key} loopback RDMA write {average:.1f} Gb/s, expected at least {floor:.1f}"
            f" Gb/s (port rate {run.rate})",
            target=run.key,
            evidence=evidence,
        )
    limit = f", floor {floor:.1f}" if floor is not None else ", no floor"
    return ok(
        NAME,
        f"{run.key} loopback RDMA write {average:.1f} Gb/s{limit}",
        target=run.key,
        evidence=evidence,
    )
