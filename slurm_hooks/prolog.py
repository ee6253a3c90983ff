"""`medic-prolog`: Slurm's Prolog. A job never starts on a node Medic judges sick.

Slurm runs it as root on every allocated node (with `PrologFlags=Alloc`, at allocation
time), with SLURMD_NODENAME and SLURM_JOB_ID but no PATH. It asks the local daemon for a
launch verdict (or runs the launch tier inline when the daemon is down), and on CRITICAL
(or UNKNOWN with `on_unknown = "closed"`):

1. drains the node with Medic's reason (first, so Slurm's own "Prolog error" drain does not
   replace it: a node already drained keeps its reason);
2. starts a detached releaser: Slurm requeues the job but holds it
   (launch_failed_requeued_held); the releaser releases it so it runs elsewhere, no human;
3. exits 1, which is what makes Slurm requeue the job.

The gate decision is recorded per job (an event of kind "gate"). A broken configuration
lets the job run (exit 0, error on stderr): a typo must not stop a whole cluster.
"""

from __future__ import annotations

import os
import sys

from medic_core.config import ConfigError, load_config


def main() -> int:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    try:
        config = load_config()
        from slurm_hooks.settings import HookSettings

        settings = HookSettings.from_config(config)
    except ConfigError as exc:
        print(f"medic-prolog: {exc} (job {job_id} allowed)", file=sys.stderr)
        return 0
    from slurm_hooks.verdict import decide, launch_verdict

    verdict = launch_verdict(config, settings, job_id)
    decision = decide(verdict, settings)
    from slurm_hooks.actions import record_gate, refuse_launch

    record_gate(config, job_id, verdict, decision)
    if decision.allow:
        return 0
    message = refuse_launch(config, settings, job_id, decision)
    print(f"medic-prolog: {message}", file=sys.stderr)
    return 1
