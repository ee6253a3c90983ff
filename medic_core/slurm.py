"""Medic's one interface to Slurm: read nodes and jobs, drain, resume, reboot, requeue, hold,
release, comment. The names the rest of Medic imports, from the modules of one concern each:

* medic_core.slurm_types: NodeInfo, JobInfo, their state words, SlurmError and the
  SlurmClient protocol;
* medic_core.slurm_json: `sinfo`/`scontrol`/`squeue --json` read per JSON layout (one per
  Slurm release line, docs/slurm-client.md);
* medic_core.slurm_node_line: one node's `scontrol -o show node NAME` line;
* medic_core.slurm_cli: CliSlurm, the SlurmClient over Slurm's commands.
"""

from __future__ import annotations

from medic_core.hostlist import expand_hostlist
from medic_core.slurm_cli import BIN_DIRS_ENV, DEFAULT_BIN_DIRS, DEFAULT_TIMEOUT, CliSlurm
from medic_core.slurm_json import (
    LEGACY,
    MAX_GPUS_PER_NODE,
    NODE_PARSERS,
    SUPPORTED_LAYOUTS,
    gpu_indices,
    layout_of,
    parse_jobs,
    parse_nodes,
    parse_sinfo,
    parse_squeue,
)
from medic_core.slurm_node_line import SCONTROL_ENV, parse_node_line, parse_scontrol_node
from medic_core.slurm_types import (
    FINAL_JOB_STATES,
    JOB_BASE_STATES,
    NEXT_STATES,
    NODE_BASE_STATES,
    REBOOT_FLAGS,
    JobInfo,
    NodeInfo,
    SlurmClient,
    SlurmError,
)

__all__ = [
    "BIN_DIRS_ENV",
    "DEFAULT_BIN_DIRS",
    "DEFAULT_TIMEOUT",
    "FINAL_JOB_STATES",
    "JOB_BASE_STATES",
    "LEGACY",
    "MAX_GPUS_PER_NODE",
    "NEXT_STATES",
    "NODE_BASE_STATES",
    "NODE_PARSERS",
    "REBOOT_FLAGS",
    "SCONTROL_ENV",
    "SUPPORTED_LAYOUTS",
    "CliSlurm",
    "JobInfo",
    "NodeInfo",
    "SlurmClient",
    "SlurmError",
    "expand_hostlist",
    "gpu_indices",
    "layout_of",
    "parse_jobs",
    "parse_node_line",
    "parse_nodes",
    "parse_scontrol_node",
    "parse_sinfo",
    "parse_squeue",
]
