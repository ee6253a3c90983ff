"""The launch tier in the calling process, for when the node's daemon does not answer: the
prolog's and HealthCheckProgram's fallback. Slower than asking the daemon, but the gate holds."""

from __future__ import annotations

import time

from healthd.checks import load_check_configs
from healthd.checks.base import CheckContext, Tier, gpu_checks_skipped
from healthd.nvml_client import NvmlError, NvmlUnavailable, PynvmlClient
from healthd.results import finding_of
from healthd.runner import Runner
from medic_core.config import MedicConfig
from medic_core.settings import DaemonSettings
from medic_core.status import Status
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
    deadline = started + budget
    if budget <= MIN_BUDGET:
        return out_of_time("inline", f"{max(budget, 0.0):.2f}s left for the checks")
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
        names = runner.selected(tier=Tier.LAUNCH)
        report = runner.run(names, budget=max(0.0, deadline - time.monotonic()))
    finally:
        if client is not None:
            client.close()
    findings = [finding_of(r) for r in report.results]
    return Verdict.of(findings, "inline", time.monotonic() - started)
