"""The prolog's slow path: the daemon refused the node, or did not answer."""

from __future__ import annotations

import sys
from typing import Any

from healthd.inline import run_inline
from medic_core.config import ConfigError, MedicConfig
from medic_core.decide import decide_launch as decide
from medic_core.settings import HookSettings
from medic_core.vocabulary import Verdict
from slurm_hooks.actions import record_gate, refuse_launch


def gate_slow_path(config: MedicConfig, job_id: str, reply: dict[str, Any]) -> int:
    try:
        settings = HookSettings.from_config(config)
    except ConfigError as exc:
        print(f"medic-prolog: {exc} (job {job_id} allowed)", file=sys.stderr)
        return 0
    if reply.get("allow") is None:  # no daemon: judge here, and record it ourselves
        inline = run_inline(config, settings.launch_budget)
        verdict = Verdict(
            inline.status, inline.findings, "inline", inline.seconds, str(reply.get("note", ""))
        )
        decision = decide(verdict, settings)
        record_gate(config, job_id, verdict, decision)
    else:  # the daemon decided (and recorded) a refusal
        verdict = Verdict.from_reply(reply, "healthd", float(reply.get("seconds", 0.0)))
        decision = decide(verdict, settings)
    if decision.allow:
        return 0
    message = refuse_launch(config, settings, job_id, decision)
    print(f"medic-prolog: {message}", file=sys.stderr)
    return 1
