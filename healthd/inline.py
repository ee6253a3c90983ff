"""The launch tier in the calling process, for when the node's daemon does not answer: the
prolog's and HealthCheckProgram's fallback. Slower than asking the daemon, but the gate holds."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from healthd.checks import load_check_configs
from healthd.checks.base import CheckContext, Tier, gpu_checks_skipped
from healthd.nvml_client import NvmlError, NvmlUnavailable, PynvmlClient
from healthd.results import finding_of, result_json
from healthd.runner import Runner, RunReport
from medic_core.api import HealthdUnavailable, ask
from medic_core.config import MedicConfig
from medic_core.settings import DaemonSettings
from medic_core.status import Status, worst
from medic_core.vocabulary import Finding, Verdict

MIN_BUDGET = 0.05  # seconds: less than this left, and no check could answer in time


def out_of_time(source: str, why: str) -> Verdict:
    """The verdict when the launch budget ran out before the checks could answer: UNKNOWN
    (the gate's on_unknown policy decides), with one finding that says so."""
    finding = Finding(
        "launch",
        Status.UNKNOWN,
        "launch.deadline",
        "",
        f"no launch verdict within the launch budget: {why}",
    )
    return Verdict.of([finding], source)


def run_inline(config: MedicConfig, budget: float) -> Verdict:
    """The launch tier in this process (no daemon): slower, but the gate still holds.

    `budget` is what is left of the prolog's deadline, and all of it: NVML's initialisation
    may take half (a hung `nvmlInit` is abandoned then, its thread left behind; the GPU
    checks then report UNKNOWN at once), the checks run in what is left, and a check that
    has not answered by the deadline is UNKNOWN. No time left: UNKNOWN without trying."""
    started = time.monotonic()
    if budget <= MIN_BUDGET:
        return out_of_time("inline", f"{max(budget, 0.0):.2f}s left for the checks")
    report = run_checks(config, (), Tier.LAUNCH, budget)
    findings = [finding_of(r) for r in report.results]
    return Verdict.of(findings, "inline", time.monotonic() - started)


def run_checks(config: MedicConfig, names: Sequence[str], tier: Tier, budget: float) -> RunReport:
    """`names` (or every check of `tier`) in this process, with the node's NVML client as
    the daemon would have it: the one inline run under the prolog's launch tier and the
    sweep's deep probe. NVML's initialisation may take half the budget."""
    deadline = time.monotonic() + budget
    gpus = DaemonSettings.from_config(config).gpus
    client: PynvmlClient | None = None
    driver = False
    if gpus != "none":
        client = PynvmlClient(call_timeout=min(3.0, budget / 2), init_timeout=budget / 2)
        driver = True
        try:
            client.open()
        except NvmlUnavailable:
            client, driver = None, False
        except NvmlError:
            pass  # a GPU node in trouble (hung or failing init): the GPU checks report it
    try:
        # A CPU node leaves the GPU checks out, as the daemon and `medic check` do.
        skip = gpu_checks_skipped(gpus, driver)
        ctx = CheckContext.for_root(config.paths.host_root, nvml=client, gpu_skip=skip)
        runner = Runner(ctx, load_check_configs(config))
        chosen = list(names) if names else runner.selected(tier=tier)
        return runner.run(chosen, budget=max(0.0, deadline - time.monotonic()))
    finally:
        if client is not None:
            client.close()


def deep_probe(config: MedicConfig, checks: Sequence[str], timeout: float) -> dict[str, Any]:
    """The deep tier on this node (`medic sweep probe`, run by `medic sweep run`): through
    the node's medic-healthd when it answers (it records the results and responds to a
    fault as always), else inline in this process, NVML included."""
    started = time.monotonic()
    request: dict[str, Any] = {"op": "check", "budget": timeout}
    if checks:
        request["checks"] = list(checks)
    else:
        request["tier"] = "deep"
    try:
        reply = ask(config.paths.socket, request, timeout=timeout + 30)
        source = "healthd"
        results = list(reply.get("results", []))
    except HealthdUnavailable:
        report = run_checks(config, checks, Tier.DEEP, timeout)
        source = "inline"
        results = [result_json(r) for r in report.results]
    return {
        "node": config.node_name,
        "source": source,
        "status": worst(Status(r.get("status", "UNKNOWN")) for r in results).value,
        "seconds": round(time.monotonic() - started, 3),
        "results": results,
    }
