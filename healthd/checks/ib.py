"""InfiniBand ports from /sys/class/infiniband: state, physical state, rate, port count and
the growth of error counters between runs.

A port that is down (`ib.port.down`) recommends `recheck`: a link may come back (a switch
reboot, a reseated cable), so the node is drained and the port re-checked, then a human;
never a GPU reset, a reboot or an RMA of the node's GPUs. The finding names the HCA and port
(target "mlx5_0/1"; evidence hca, port, state, phys_state, rate, link_layer and the HCA's
node_guid when readable). The daemon's kernel log follower wakes this check at once on the
mlx5 driver's link lines (healthd/kmsg_watch.py), so a port going down is judged in about a
second rather than at the next interval."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Result,
    Status,
    Tier,
    bounds,
    fault,
    not_applicable,
    ok,
    register,
    setting,
)
from healthd.hostfs import list_dir, read_value

NAME = "ib"
CLASS_DIR = "sys/class/infiniband"

# Error counters worth watching and the fault class their growth raises.
COUNTER_FAULTS: Mapping[str, str] = {
    "symbol_error": "ib.errors.symbol",
    "link_downed": "ib.errors.link_downed",
    "link_error_recovery": "ib.errors.link_recovery",
    "port_rcv_errors": "ib.errors.rcv",
    "port_rcv_remote_physical_errors": "ib.errors.rcv_remote_physical",
    "local_link_integrity_errors": "ib.errors.link_integrity",
    "excessive_buffer_overrun_errors": "ib.errors.buffer_overrun",
    "port_xmit_discards": "ib.errors.xmit_discards",
}

DEFAULT_COUNTER_LIMITS: Mapping[str, int] = {
    "symbol_error": 10,
    "link_downed": 0,
    "link_error_recovery": 0,
    "port_rcv_errors": 10,
    "port_rcv_remote_physical_errors": 10,
    "local_link_integrity_errors": 0,
    "excessive_buffer_overrun_errors": 0,
}

_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
_STATE = re.compile(r"^\s*(\d+)\s*:\s*(\S+)")


@dataclass(frozen=True, kw_only=True)
class IbConfig(CheckConfig):
    expected_ports: int | None = setting(
        None, minimum=0, doc="number of ports (of the watched link layers) this node must have"
    )
    min_rate_gbps: float = setting(0.0, minimum=0, doc="lowest acceptable rate, 0 = any")
    link_layers: tuple[str, ...] = setting(
        ("InfiniBand",),
        choices=("InfiniBand", "Ethernet"),
        doc="link layers to watch; RoCE/Ethernet ports are skipped by default",
    )
    ignore_hcas: tuple[str, ...] = setting((), doc="HCA names to skip, e.g. a storage NIC")
    counter_limits: dict[str, int] = field(
        default_factory=lambda: dict(DEFAULT_COUNTER_LIMITS),
        metadata=bounds(
            minimum=0,
            keys=tuple(COUNTER_FAULTS),
            doc="largest growth of an error counter between two runs before WARN; "
            "merged over the defaults",
        ),
    )

    def __post_init__(self) -> None:
        merged = {**DEFAULT_COUNTER_LIMITS, **self.counter_limits}
        object.__setattr__(self, "counter_limits", merged)


@dataclass(frozen=True)
class IbPort:
    hca: str
    port: int
    state: str | None  # "4: ACTIVE"; None when the attribute is absent
    phys_state: str | None  # "5: LinkUp"
    rate: str | None  # "400 Gb/sec (4X NDR)"
    link_layer: str | None
    counters: Mapping[str, int] = field(default_factory=dict)
    read_errors: Mapping[str, str] = field(default_factory=dict)
    node_guid: str | None = None  # the HCA's, "b8ce:f603:00a1:2f3c"; None when unreadable

    @property
    def key(self) -> str:
        return f"{self.hca}/{self.port}"


@dataclass(frozen=True)
class IbObservation:
    present: bool  # /sys/class/infiniband exists
    ports: tuple[IbPort, ...]
    previous_counters: Mapping[str, Mapping[str, int]] | None = None  # by port key


def parse_rate_gbps(rate: str | None) -> float | None:
    match = _RATE.match(rate or "")
    return float(match.group(1)) if match else None


def parse_state(text: str | None) -> tuple[int, str] | None:
    match = _STATE.match(text or "")
    return (int(match.group(1)), match.group(2)) if match else None


def _read_node_guid(ctx: CheckContext, hca: str) -> str | None:
    try:
        return read_value(ctx.roots.root, f"{CLASS_DIR}/{hca}/node_guid") or None
    except OSError:
        return None  # evidence only: a port's verdict never depends on it


def _read_port(ctx: CheckContext, hca: str, port: int, node_guid: str | None = None) -> IbPort:
    base = f"{CLASS_DIR}/{hca}/ports/{port}"
    root = ctx.roots.root
    values: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for attr in ("state", "phys_state", "rate", "link_layer"):
        try:
            values[attr] = read_value(root, f"{base}/{attr}")
        except OSError as exc:
            values[attr], errors[attr] = None, str(exc)
    counters: dict[str, int] = {}
    for name in COUNTER_FAULTS:
        try:
            value = read_value(root, f"{base}/counters/{name}")
            if value is not None:
                counters[name] = int(value)
        except (OSError, ValueError) as exc:
            errors[f"counters/{name}"] = str(exc)
    return IbPort(
        hca,
        port,
        values["state"],
        values["phys_state"],
        values["rate"],
        values["link_layer"],
        counters,
        errors,
        node_guid,
    )


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=60,
    timeout=10,
    needs=("host",),
    faults={
        "ib.port.down": Fault(
            Status.CRITICAL,
            "state is not 4: ACTIVE or phys_state is not 5: LinkUp (target hca/port; evidence"
            " names the HCA, port and node GUID)",
        ),
        "ib.port.rate": Fault(
            Status.CRITICAL, "rate below min_rate_gbps (e.g. 200 Gb/sec (2X NDR): a lane down)"
        ),
        "ib.port.missing": Fault(
            (Status.WARN, Status.CRITICAL),
            "watched port count differs from expected_ports (CRITICAL fewer, WARN more)",
        ),
        "ib.errors.symbol": Fault(
            Status.WARN, "symbol_error grew by more than its limit since the last run"
        ),
        "ib.errors.link_downed": Fault(
            Status.WARN, "link_downed grew by more than its limit since the last run"
        ),
        "ib.errors.link_recovery": Fault(
            Status.WARN, "link_error_recovery grew by more than its limit since the last run"
        ),
        "ib.errors.rcv": Fault(
            Status.WARN, "port_rcv_errors grew by more than its limit since the last run"
        ),
        "ib.errors.rcv_remote_physical": Fault(
            Status.WARN,
            "port_rcv_remote_physical_errors grew by more than its limit since the last run",
        ),
        "ib.errors.link_integrity": Fault(
            Status.WARN,
            "local_link_integrity_errors grew by more than its limit since the last run",
        ),
        "ib.errors.buffer_overrun": Fault(
            Status.WARN,
            "excessive_buffer_overrun_errors grew by more than its limit since the last run",
        ),
        "ib.errors.xmit_discards": Fault(
            Status.WARN, "port_xmit_discards grew by more than its limit since the last run"
        ),
        "check.read_error": Fault(
            Status.UNKNOWN, "a port attribute exists but cannot be read or parsed"
        ),
    },
)
class IbCheck(Check[IbObservation, IbConfig]):
    """InfiniBand ports: state, physical state, rate, port count, error-counter growth."""

    config_type = IbConfig

    def __init__(self) -> None:
        self._previous: dict[str, dict[str, int]] | None = None

    def gather(self, ctx: CheckContext, cfg: IbConfig) -> IbObservation:
        hcas = list_dir(ctx.roots.root, CLASS_DIR)
        if hcas is None:
            return IbObservation(present=False, ports=())
        ports: list[IbPort] = []
        for hca in hcas:
            if hca in cfg.ignore_hcas:
                continue
            guid = _read_node_guid(ctx, hca)
            for port in list_dir(ctx.roots.root, f"{CLASS_DIR}/{hca}/ports") or []:
                if port.isdigit():
                    ports.append(_read_port(ctx, hca, int(port), guid))
        observation = IbObservation(True, tuple(ports), self._previous)
        self._previous = {p.key: dict(p.counters) for p in ports}
        return observation

    @staticmethod
    def evaluate(observation: IbObservation, cfg: IbConfig) -> list[Result]:
        watched = [
            p for p in observation.ports if p.link_layer is None or p.link_layer in cfg.link_layers
        ]
        if not watched and not cfg.expected_ports:
            why = "absent" if not observation.present else "has no watched ports"
            return [
                not_applicable(
                    NAME,
                    f"/sys/class/infiniband {why} and no ports are expected",
                    {"present": observation.present, "link_layers": list(cfg.link_layers)},
                )
            ]
        results: list[Result] = []
        if cfg.expected_ports is not None and len(watched) != cfg.expected_ports:
            status = Status.CRITICAL if len(watched) < cfg.expected_ports else Status.WARN
            results.append(
                fault(
                    NAME,
                    status,
                    "ib.port.missing",
                    f"{len(watched)} InfiniBand ports, expected {cfg.expected_ports}",
                    evidence={
                        "found": [p.key for p in watched],
                        "expected": cfg.expected_ports,
                    },
                )
            )
        for port in watched:
            previous = (observation.previous_counters or {}).get(port.key)
            findings = list(_port_findings(port, previous, cfg))
            results.extend(findings)
            if not findings:
                results.append(
                    ok(
                        NAME,
                        f"{port.key} {port.state} {port.rate}",
                        target=port.key,
                        evidence={"rate": port.rate, "counters": dict(port.counters)},
                    )
                )
        return results


def _port_findings(
    port: IbPort, previous: Mapping[str, int] | None, cfg: IbConfig
) -> Iterator[Result]:
    evidence = {
        "state": port.state,
        "phys_state": port.phys_state,
        "rate": port.rate,
        "link_layer": port.link_layer,
    }
    where = {"hca": port.hca, "port": port.port, "node_guid": port.node_guid}
    if port.read_errors:
        yield fault(
            NAME,
            Status.UNKNOWN,
            "check.read_error",
            f"{port.key}: could not read {', '.join(sorted(port.read_errors))}",
            target=port.key,
            evidence={**evidence, "read_errors": dict(port.read_errors)},
        )
    state, phys = parse_state(port.state), parse_state(port.phys_state)
    if state is None or phys is None:
        if not port.read_errors:
            yield fault(
                NAME,
                Status.UNKNOWN,
                "check.read_error",
                f"{port.key}: state or phys_state missing or unparseable",
                target=port.key,
                evidence=evidence,
            )
        return
    if state[1] != "ACTIVE" or phys[1] != "LinkUp":
        guid = f", node GUID {port.node_guid}" if port.node_guid else ""
        yield fault(
            NAME,
            Status.CRITICAL,
            "ib.port.down",
            f"HCA {port.hca} port {port.port}{guid} is {port.state} / {port.phys_state},"
            " expected 4: ACTIVE / 5: LinkUp",
            target=port.key,
            evidence={**where, **evidence},
        )
        return  # a down port reports a meaningless rate
    gbps = parse_rate_gbps(port.rate)
    if cfg.min_rate_gbps and (gbps is None or gbps < cfg.min_rate_gbps):
        yield fault(
            NAME,
            Status.CRITICAL,
            "ib.port.rate",
            f"{port.key} runs at {port.rate}, expected at least {cfg.min_rate_gbps:g} Gb/sec",
            target=port.key,
            evidence={**evidence, "rate_gbps": gbps, "min_rate_gbps": cfg.min_rate_gbps},
        )
    if previous is None:
        return
    for counter, limit in sorted(cfg.counter_limits.items()):
        now, before = port.counters.get(counter), previous.get(counter)
        if now is None or before is None or now < before:
            continue  # absent, or reset (driver reload, perfquery -R) since the last run
        if now - before > limit:
            yield fault(
                NAME,
                Status.WARN,
                COUNTER_FAULTS[counter],
                f"{port.key} {counter} grew by {now - before} since the last run (limit {limit})",
                target=port.key,
                evidence={"counter": counter, "before": before, "now": now, "limit": limit},
            )
