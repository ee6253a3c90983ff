"""`medic-prolog`: Slurm's Prolog. A job never starts on a node Medic judges sick.

Slurm runs it as root on every allocated node (with `PrologFlags=Alloc`, at allocation
time), with SLURMD_NODENAME and SLURM_JOB_ID but no PATH. The common case is fast and
imports only the standard library: ask the local daemon, which answers from fresh results,
decides with the `[hooks]` policy and records the gate decision for the job. Only a refusal,
or a daemon that does not answer, takes the slow path (slurm_hooks.gate): the launch tier
inline when needed, then on CRITICAL (or UNKNOWN with `on_unknown = "closed"`):

1. drain the node with Medic's reason (first, so Slurm's own "Prolog error" drain does not
   replace it: a node already drained keeps its reason);
2. start a detached releaser: Slurm requeues the job but holds it
   (launch_failed_requeued_held); the releaser releases it so it runs elsewhere, no human;
3. exit 1, which is what makes Slurm requeue the job.

A broken configuration lets the job run (exit 0, error on stderr): a typo must not stop a
whole cluster.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from healthd.api import HealthdUnavailable, ask
from medic_core.config import ConfigError, load_config

DEFAULT_BUDGET = 10.0


def _reply_from_front() -> dict[str, Any] | None:
    """The daemon's answer when the compiled front (medic-hook) already asked and was not
    told "allow": asking again would record the gate decision twice."""
    text = os.environ.pop("MEDIC_LAUNCH_REPLY", "")
    if not text:
        return None
    try:
        reply = json.loads(text)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def main() -> int:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"medic-prolog: {exc} (job {job_id} allowed)", file=sys.stderr)
        return 0
    budget = config.table("hooks").get("launch_budget", DEFAULT_BUDGET)
    budget = float(budget) if isinstance(budget, int | float) else DEFAULT_BUDGET
    reply = _reply_from_front()
    if reply is None:
        try:
            reply = ask(
                config.paths.socket,
                {"op": "launch", "budget": budget * 0.8, "job_id": job_id},
                timeout=budget * 0.9,
            )
        except HealthdUnavailable as exc:
            reply = {"allow": None, "note": str(exc)}
    if reply.get("allow") is True:
        return 0
    from slurm_hooks.gate import gate_slow_path

    return gate_slow_path(config, job_id, reply)
