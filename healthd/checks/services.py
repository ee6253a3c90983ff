"""Required daemons: a live process with the service's name under /proc. On a node declared
a CPU node (`[healthd] gpus = "none"`) the GPU daemons (nvidia-persistenced, nv-fabricmanager,
DCGM's nv-hostengine) are not required.

`service.down` recommends `restart_service`: the ladder starts no GPU rung for it (never a
driver reload); a human, or a capped restart of exactly the unit named in the finding's
evidence (`unit`, e.g. munge.service for munged), brings it back."""

from __future__ import annotations

import dataclasses
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
from healthd.hostfs import list_dir, read_text, read_value

NAME = "services"
COMM_LEN = 15  # the kernel truncates /proc/<pid>/comm to TASK_COMM_LEN - 1 bytes
FABRICMANAGER = "nv-fabricmanager"
# Daemons only a GPU node runs (DCGM's is nv-hostengine): never required on a node declared
# a CPU node ([healthd] gpus = "none"), whatever `required` says.
GPU_SERVICES = frozenset({"nvidia-persistenced", FABRICMANAGER, "nv-hostengine"})
_GPU_COMMS = frozenset(name[:COMM_LEN] for name in GPU_SERVICES)
# The systemd unit of each daemon whose process name differs from "<name>.service".
DEFAULT_UNITS: Mapping[str, str] = {
    "munged": "munge.service",
    "nvidia-persistenced": "nvidia-persistenced.service",
    FABRICMANAGER: "nvidia-fabricmanager.service",
}


@dataclass(frozen=True, kw_only=True)
class ServicesConfig(CheckConfig):
    required: tuple[str, ...] = setting(
        ("munged", "nvidia-persistenced"), doc="process names that must be running"
    )
    fabricmanager: bool = setting(
        False, doc="also require nv-fabricmanager (NVSwitch systems: HGX H100/H200/B200)"
    )
    units: dict[str, str] = field(
        default_factory=lambda: dict(DEFAULT_UNITS),
        metadata=bounds(
            doc="systemd unit per process name, merged over the defaults"
            " (munged = munge.service); any other name is <name>.service"
        ),
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "units", {**DEFAULT_UNITS, **self.units})

    def for_cpu_node(self) -> ServicesConfig:
        return dataclasses.replace(
            self,
            required=tuple(n for n in self.required if n[:COMM_LEN] not in _GPU_COMMS),
            fabricmanager=False,
        )

    def unit(self, service: str) -> str:
        return self.units.get(service) or f"{service}.service"

    @property
    def services(self) -> tuple[str, ...]:
        return self.required + ((FABRICMANAGER,) if self.fabricmanager else ())

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for name in self.required:
            if not name or "/" in name:
                yield "required", f"{name!r} is not a process name", "give the daemon's name"
        for name, unit in self.units.items():
            if "/" in unit or not unit.endswith(".service"):
                yield f"units.{name}", f"{unit!r} is not a service unit", "e.g. munge.service"


@dataclass(frozen=True)
class ServicesObservation:
    processes: Mapping[str, tuple[int, ...]]  # comm -> live pids (zombies excluded)


def _state(stat: str | None) -> str | None:
    """The state letter from /proc/<pid>/stat (after the parenthesised comm)."""
    if stat is None or ")" not in stat:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    return rest[0] if rest else None


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=60,
    timeout=5,
    faults={
        "service.down": Fault(
            Status.CRITICAL, "no live (non-zombie) process with the service's name"
        )
    },
)
class ServicesCheck(Check[ServicesObservation, ServicesConfig]):
    """Required services (munged, nvidia-persistenced, optionally nv-fabricmanager) run."""

    config_type = ServicesConfig

    def gather(self, ctx: CheckContext, cfg: ServicesConfig) -> ServicesObservation:
        pids = list_dir(ctx.roots.root, "proc")
        if pids is None:
            raise FileNotFoundError(f"{ctx.roots.proc} is missing")
        processes: dict[str, list[int]] = {}
        for pid in pids:
            if not pid.isdigit():
                continue
            try:
                comm = read_value(ctx.roots.proc, f"{pid}/comm")
                state = _state(read_text(ctx.roots.proc, f"{pid}/stat"))
            except ProcessLookupError:
                continue  # exited between listing and reading
            if comm is None or state == "Z":
                continue
            processes.setdefault(comm, []).append(int(pid))
        return ServicesObservation({k: tuple(v) for k, v in processes.items()})

    @staticmethod
    def evaluate(observation: ServicesObservation, cfg: ServicesConfig) -> list[Result]:
        if not cfg.services:
            return [not_applicable(NAME, "no services required")]
        results = []
        for service in cfg.services:
            pids = observation.processes.get(service[:COMM_LEN], ())
            if pids:
                results.append(
                    ok(NAME, f"{service} running", target=service, evidence={"pids": list(pids)})
                )
            else:
                results.append(
                    fault(
                        NAME,
                        Status.CRITICAL,
                        "service.down",
                        f"{service} is not running (unit {cfg.unit(service)})",
                        target=service,
                        evidence={"comm": service[:COMM_LEN], "unit": cfg.unit(service)},
                    )
                )
        return results
