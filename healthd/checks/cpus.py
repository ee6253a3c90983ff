"""CPUs: every possible CPU online, and the count this node should have."""

from __future__ import annotations

from dataclasses import dataclass

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Result,
    Status,
    Tier,
    fault,
    ok,
    register,
    setting,
)
from healthd.hostfs import format_range_list, parse_range_list, read_value

NAME = "cpus"
CPU_DIR = "sys/devices/system/cpu"


@dataclass(frozen=True, kw_only=True)
class CpusConfig(CheckConfig):
    expected_count: int | None = setting(
        None, minimum=1, doc="number of online CPUs this node must have; unset = any"
    )
    require_all_online: bool = setting(
        True, doc="every possible CPU must be online (false with nosmt or isolated CPUs)"
    )


@dataclass(frozen=True)
class CpusObservation:
    online: str | None  # the kernel's range list, "0-111"; None when absent
    possible: str | None


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=300,
    timeout=5,
    faults={
        "cpu.offline": Fault(
            Status.CRITICAL, "a possible CPU is offline (with require_all_online)"
        ),
        "cpu.count": Fault(Status.CRITICAL, "online CPUs differ from expected_count"),
        "check.read_error": Fault(
            Status.UNKNOWN, "/sys/devices/system/cpu/online or possible is missing"
        ),
    },
)
class CpusCheck(Check[CpusObservation, CpusConfig]):
    """CPUs: all possible CPUs online and the expected count."""

    config_type = CpusConfig

    def gather(self, ctx: CheckContext, cfg: CpusConfig) -> CpusObservation:
        root = ctx.roots.root
        return CpusObservation(
            read_value(root, f"{CPU_DIR}/online"), read_value(root, f"{CPU_DIR}/possible")
        )

    @staticmethod
    def evaluate(observation: CpusObservation, cfg: CpusConfig) -> list[Result]:
        if observation.online is None or observation.possible is None:
            return [
                fault(
                    NAME,
                    Status.UNKNOWN,
                    "check.read_error",
                    f"{CPU_DIR}/online or /possible is missing",
                )
            ]
        try:
            online = parse_range_list(observation.online)
            possible = parse_range_list(observation.possible)
        except ValueError as exc:
            return [
                fault(
                    NAME, Status.UNKNOWN, "check.read_error", f"{CPU_DIR}/online or possible: {exc}"
                )
            ]
        evidence = {"online": observation.online, "possible": observation.possible}
        results: list[Result] = []
        offline = possible - online
        if offline and cfg.require_all_online:
            results.append(
                fault(
                    NAME,
                    Status.CRITICAL,
                    "cpu.offline",
                    f"{len(offline)} CPUs offline: {format_range_list(offline)}",
                    evidence={**evidence, "offline": format_range_list(offline)},
                )
            )
        if cfg.expected_count is not None and len(online) != cfg.expected_count:
            results.append(
                fault(
                    NAME,
                    Status.CRITICAL,
                    "cpu.count",
                    f"{len(online)} CPUs online, expected {cfg.expected_count}",
                    evidence={**evidence, "expected_count": cfg.expected_count},
                )
            )
        return results or [ok(NAME, f"{len(online)} CPUs online", evidence=evidence)]
