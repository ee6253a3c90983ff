"""Getting a launch verdict and deciding on it: the prolog's question, "may this job start
on this node?".

The verdict comes from the local `medic-healthd` over its socket (milliseconds: it answers
from fresh results); when the daemon is down or slow, the launch tier runs inline within
what is left of the budget. `decide` is pure: verdict and settings in, decision out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from medic_core.config import MedicConfig
from medic_core.status import Status, worst
from slurm_hooks.settings import HookSettings


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    fault_class: str
    target: str
    message: str
    recommendation: str = ""  # what to do about it: gpu_reset, reboot, rma, drain, none

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        evidence = data.get("evidence") or {}
        return cls(
            check=str(data.get("check", "")),
            status=Status(data.get("status", "UNKNOWN")),
            fault_class=str(data.get("fault_class") or ""),
            target=str(data.get("target") or ""),
            message=str(data.get("message", "")),
            recommendation=str(evidence.get("recommendation") or data.get("remediation") or ""),
        )


@dataclass(frozen=True)
class Verdict:
    status: Status
    findings: tuple[Finding, ...]
    source: str  # "healthd", "inline"
    seconds: float
    note: str = ""  # why the daemon was not used, when it was not

    @classmethod
    def from_reply(cls, reply: dict[str, Any], source: str, seconds: float) -> Verdict:
        findings = tuple(Finding.from_json(r) for r in reply.get("results", []))
        status = worst([f.status for f in findings])
        return cls(status, findings, source, seconds)


@dataclass(frozen=True)
class GateDecision:
    allow: bool
    status: Status
    blocking: tuple[Finding, ...] = field(default=())
    why: str = ""

    @property
    def first(self) -> Finding | None:
        return self.blocking[0] if self.blocking else None


def decide(verdict: Verdict, settings: HookSettings) -> GateDecision:
    critical = tuple(f for f in verdict.findings if f.status is Status.CRITICAL)
    if critical:
        return GateDecision(False, Status.CRITICAL, critical, "CRITICAL fault on this node")
    unknown = tuple(f for f in verdict.findings if f.status is Status.UNKNOWN)
    if unknown and settings.on_unknown == "closed":
        return GateDecision(
            False, Status.UNKNOWN, unknown, "a launch check could not tell (on_unknown=closed)"
        )
    return GateDecision(True, verdict.status, (), "")


def run_inline(config: MedicConfig, budget: float) -> Verdict:
    """The launch tier in this process (no daemon): slower, but the gate still holds."""
    from healthd.checks import load_check_configs
    from healthd.checks.base import CheckContext, Tier
    from healthd.daemon import DaemonSettings, result_json
    from healthd.nvml_client import NvmlError, NvmlUnavailable, PynvmlClient
    from healthd.runner import Runner

    started = time.monotonic()
    gpus = DaemonSettings.from_config(config).gpus
    client: PynvmlClient | None = None
    skip_gpu = gpus == "none"
    if not skip_gpu:
        client = PynvmlClient(call_timeout=min(3.0, budget / 2))
        try:
            client.open()
        except NvmlUnavailable:
            client = None
            skip_gpu = gpus == "auto"  # no driver: a CPU node, as the daemon would judge
        except NvmlError:
            pass  # a GPU node in trouble: the GPU checks report it
    try:
        ctx = CheckContext.for_root(config.paths.host_root, nvml=client)
        runner = Runner(ctx, load_check_configs(config))
        names = [
            name
            for name in runner.selected(tier=Tier.LAUNCH)
            if not (skip_gpu and "nvml" in runner.specs[name].needs)
        ]
        report = runner.run(names, budget=budget)
    finally:
        if client is not None:
            client.close()
    reply = {"results": [result_json(r) for r in report.results]}
    return Verdict.from_reply(reply, "inline", time.monotonic() - started)
