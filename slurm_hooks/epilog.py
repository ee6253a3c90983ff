"""`medic-epilog`: Slurm's Epilog. Tells the local daemon that a job ended and returns at
once; the daemon runs the post-job checks (GPUs still there and answering, XIDs or ECC errors
during the job, processes left on the GPUs once the leak check's grace has passed), records
the job's health summary (an event of kind "job_summary": faults seen, XIDs, this node) and,
on CRITICAL, drains the node with Medic's reason and starts the ladder, as for any fault.
It always exits 0: Slurm's own "Epilog error" drain would only hide Medic's reason.

With `[hygiene] enabled`, it then cleans what the job left on the node within `[hygiene]
budget` and drains as `user_problem` what survives SIGKILL (slurm_hooks.hygiene_run); the
compiled front execs `medic-epilog --hygiene` for that when the daemon's job_end reply says
so, having told the daemon itself.

When the job registered a node-local checkpoint tier on this node (slurm_hooks.local_tier),
it also starts the detached sweep that removes it once the job has ended for good (not on a
requeue). The compiled front execs `medic-epilog --local-tier` for that, having told the
daemon itself.
"""

from __future__ import annotations

import os
import sys
import time

from medic_core import proc
from medic_core.api import HealthdUnavailable, ask
from medic_core.config import ConfigError, MedicConfig, load_config
from slurm_hooks import local_tier


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # [hygiene] budget counts from here
    args = sys.argv[1:] if argv is None else argv
    job_id = os.environ.get("SLURM_JOB_ID", "")
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"medic-epilog: job {job_id}: no post-job checks: {exc}", file=sys.stderr)
        return 0
    if "--local-tier" not in args and "--hygiene" not in args:  # else the front told it
        try:
            ask(config.paths.socket, {"op": "job_end", "job_id": job_id}, timeout=5.0)
        except HealthdUnavailable as exc:
            print(f"medic-epilog: job {job_id}: no post-job checks: {exc}", file=sys.stderr)
    hygiene(config, job_id, started)
    try:
        start_local_tier_sweep(config, job_id)
    except (ConfigError, OSError) as exc:
        print(f"medic-epilog: job {job_id}: node-local checkpoints kept: {exc}", file=sys.stderr)
    return 0


def hygiene(config: MedicConfig, job_id: str, started: float) -> None:
    """Post-job hygiene when `[hygiene] enabled`; never fails the epilog."""
    from medic_core.hygiene_settings import hygiene_on

    if not hygiene_on(config):
        return
    from slurm_hooks.hygiene_run import run_hygiene

    try:
        outcome = run_hygiene(config, os.environ, started)
    except (ConfigError, OSError) as exc:
        print(f"medic-epilog: job {job_id}: no hygiene: {exc}", file=sys.stderr)
        return
    if outcome.line:
        print(f"medic-epilog: job {job_id}: {outcome.line}", file=sys.stderr)


def start_local_tier_sweep(config: MedicConfig, job_id: str) -> bool:
    """Start the detached sweep when job `job_id` registered a node-local tier here: it must
    outlive the epilog, since Slurm shows whether the job was requeued only after it."""
    progress_dir = local_tier.progress_dir_of(config)
    if not local_tier.has_registration(progress_dir, job_id, config.node_name):
        return False
    from remediation.actions import slurm_env

    log_dir = config.paths.state_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    proc.spawn(
        [sys.executable, "-m", "slurm_hooks.local_tier", "--job", job_id],
        log_path=log_dir / f"local-tier-{job_id}.log",
        env={**os.environ, **slurm_env(config)},
    )
    return True
