"""`medic-epilog`: Slurm's Epilog. Tells the local daemon that a job ended and returns at
once; the daemon runs the post-job checks (GPUs still there and answering, XIDs or ECC errors
during the job, processes left on the GPUs once the leak check's grace has passed), records
the job's health summary (an event of kind "job_summary": faults seen, XIDs, this node) and,
on CRITICAL, drains the node with Medic's reason and starts the ladder, as for any fault.
It always exits 0: Slurm's own "Epilog error" drain would only hide Medic's reason.
"""

from __future__ import annotations

import os
import sys

from medic_core.api import HealthdUnavailable, ask
from medic_core.config import ConfigError, load_config


def main() -> int:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    try:
        config = load_config()
        ask(config.paths.socket, {"op": "job_end", "job_id": job_id}, timeout=5.0)
    except (ConfigError, HealthdUnavailable) as exc:
        print(f"medic-epilog: job {job_id}: no post-job checks: {exc}", file=sys.stderr)
    return 0
