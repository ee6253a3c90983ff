"""What the lab's Slurm shows of a node or a job, read the way an operator reads it."""

from __future__ import annotations

import json
from typing import Any

from cli.lab.cluster import Lab
from cli.lab.debian_root import HOST_RELEASE
from medic_core.drain_reason import is_medic_reason
from medic_core.slurm import parse_jobs


def node_info(lab: Lab, name: str) -> dict[str, Any]:
    return next(n for n in lab.sinfo_nodes() if n["name"] == name)


def drained_by_medic(lab: Lab, name: str) -> bool:
    info = node_info(lab, name)
    return "DRAIN" in info.get("state_flags", []) and is_medic_reason(info.get("reason", ""))


def job(lab: Lab, job_id: str) -> dict[str, Any]:
    """The job as 22.05's `squeue --json` prints it (`job_state` one word), finished or not:
    24.11 and 26.05 list a finished job only with --states=all, and print states as lists."""
    newer = lab.release() != HOST_RELEASE
    text = lab.slurm(["squeue", "--json", *(["--states=all"] if newer else [])]).stdout
    # squeue --json ignores --jobs in 22.05: filter here.
    every = json.loads(text)["jobs"]
    found: dict[str, Any] = next(j for j in every if str(j["job_id"]) == job_id)
    if newer:
        state = next(j.state for j in parse_jobs(text) if j.job_id == job_id)
        found = {**found, "job_state": state}
    return found


# PLANNED: the backfill scheduler has planned a job there. Slurm's own, transient, and no
# reason to call the node out of service.
SCHEDULER_FLAGS = frozenset({"PLANNED"})


def idle_and_clear(info: dict[str, Any]) -> bool:
    """Idle with no flag but the scheduler's own: no drain, no reservation, no reboot pending."""
    return info["state"] == "idle" and set(info.get("state_flags", [])) <= SCHEDULER_FLAGS
