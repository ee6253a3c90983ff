"""`medic-epilog`: Slurm's Epilog. Looks at the node right after a job: GPUs still there and
answering, XIDs or ECC errors during the job, processes left on the GPUs (after the leak
check's grace period, by the daemon's next run); records a per-job health summary (an event
of kind "job_summary": faults seen, XIDs, this node) and drains the node with Medic's reason
when the post-job checks are CRITICAL. It exits 0 even then: Slurm's own "Epilog error"
drain would only replace Medic's reason with a less useful one.
"""

from __future__ import annotations

import os
import sys

from medic_core.config import ConfigError, load_config

POST_JOB_CHECKS = ("gpu_count", "gpu_xid", "gpu_ecc", "gpu_retired_pages", "gpu_remapped_rows")


def main() -> int:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    try:
        config = load_config()
        from slurm_hooks.settings import HookSettings

        settings = HookSettings.from_config(config)
    except ConfigError as exc:
        print(f"medic-epilog: {exc}", file=sys.stderr)
        return 0
    from healthd.api import HealthdUnavailable, ask
    from slurm_hooks.actions import drain_reason_for, record_event, slurm_client
    from slurm_hooks.drain_reason import drain_if_allowed
    from slurm_hooks.verdict import Finding

    try:
        summary = ask(
            config.paths.socket,
            {
                "op": "job_summary",
                "job_id": job_id,
                "checks": list(POST_JOB_CHECKS),
                "budget": settings.launch_budget,
            },
            timeout=settings.launch_budget + 2,
        )
    except HealthdUnavailable as exc:
        print(f"medic-epilog: no summary for job {job_id}: {exc}", file=sys.stderr)
        return 0
    findings = [Finding.from_json(r) for r in summary.get("results", [])]
    critical = [f for f in findings if f.status.value == "CRITICAL"]
    record_event(
        config,
        {
            "kind": "job_summary",
            "severity": "CRITICAL" if critical else "INFO",
            "source": "epilog",
            "target": f"job:{job_id}",
            "fault_class": critical[0].fault_class if critical else "",
            "message": summary.get("message", ""),
            "evidence": {k: v for k, v in summary.items() if k not in ("results",)},
        },
    )
    if critical and settings.drain_on_epilog:
        outcome = drain_if_allowed(
            slurm_client(config, settings), config.node_name, drain_reason_for(critical[0])
        )
        print(f"medic-epilog: after job {job_id}: {outcome.value}", file=sys.stderr)
    return 0
