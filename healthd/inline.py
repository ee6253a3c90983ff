"""The launch tier in the calling process, for when the node's daemon does not answer: the
prolog's and HealthCheckProgram's fallback. Slower than asking the daemon, but the gate holds."""

from __future__ import annotations

import time

from healthd.checks import load_check_configs
from healthd.checks.base import CheckContext, Tier
from healthd.nvml_client import NvmlError, NvmlUnavailable, PynvmlClient
from healthd.results import result_json
from healthd.runner import Runner
from medic_core.config import MedicConfig
from medic_core.settings import DaemonSettings
from medic_core.vocabulary import Verdict


def run_inline(config: MedicConfig, budget: float) -> Verdict:
    """The launch tier in this process (no daemon): slower, but the gate still holds."""
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
