"""The lab as Slurm shows it: its nodes (state, flags, reason, slurmd, GPUs), the jobs not
yet finished, its reservations, and whether it is running at all; 22.05's JSON shapes
whatever the release. The middle layer of cli.lab.cluster.Lab.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.lab import scenario as scenario_mod
from cli.lab.debian_root import HOST_RELEASE
from cli.lab.lab_env import LabEnvironment
from cli.lab.processes import LabError, pid_alive, read_pid
from medic_core import slurm as slurm_json

ACTIVE_JOB_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
)


@dataclass(frozen=True)
class NodeStatus:
    name: str
    state: str
    flags: tuple[str, ...]
    reason: str
    slurmd_pid: int | None
    gpus: int

    @property
    def is_idle(self) -> bool:
        return self.state == "IDLE" and not self.flags


@dataclass
class LabStatus:
    root: Path
    running: bool
    nodes: list[NodeStatus] = field(default_factory=list)


class LabSlurmView(LabEnvironment):
    def sinfo_nodes(self) -> list[dict[str, Any]]:
        """Every node's record as 22.05's `sinfo --json` prints it. From 23.11 `sinfo --json`
        groups nodes, so newer releases are read from `scontrol show nodes --json` and given
        22.05's shape: `state` one lower-case word, `state_flags` the rest, plain numbers."""
        if self.release() == HOST_RELEASE:
            out = self.slurm(["sinfo", "--json"]).stdout
            nodes: list[dict[str, Any]] = json.loads(out)["nodes"]
            return nodes
        what = "scontrol show nodes --json"
        text = self.slurm(["scontrol", "show", "nodes", "--json"]).stdout
        raw = {str(n.get("name")): n for n in json.loads(text)["nodes"]}
        return [
            {
                **raw[info.name],
                "state": info.state.lower(),
                "state_flags": sorted(info.flags),
                "reason_changed_at": info.reason_time,
                "boot_time": info.boot_time,
            }
            for info in slurm_json.parse_nodes(text, what)
        ]

    def active_jobs(self) -> list[dict[str, Any]]:
        """Jobs not yet finished (squeue --json also lists finished ones until MinJobAge),
        `job_state` one word as in 22.05 (newer releases print a list: base state, flags)."""
        text = self.slurm(["squeue", "--json"]).stdout
        jobs: list[dict[str, Any]] = json.loads(text)["jobs"]
        if self.release() != HOST_RELEASE:
            states = {j.job_id: j.state for j in slurm_json.parse_jobs(text)}
            jobs = [{**j, "job_state": states.get(str(j.get("job_id")), "")} for j in jobs]
        return [j for j in jobs if j["job_state"] in ACTIVE_JOB_STATES]

    def nodes(self) -> list[NodeStatus]:
        state = self.state()
        result = []
        for raw in sorted(
            self.sinfo_nodes(), key=lambda n: int(n["name"][len(state.spec.node_prefix) :])
        ):
            name = raw["name"]
            layout = self.layout.node(name)
            pid = read_pid(layout.slurmd_pid)
            result.append(
                NodeStatus(
                    name=name,
                    state=str(raw["state"]).upper(),
                    flags=tuple(raw.get("state_flags", [])),
                    reason=raw.get("reason", "") or "",
                    slurmd_pid=pid if pid and pid_alive(pid) else None,
                    gpus=len(scenario_mod.read_scenario(layout.scenario).present_gpus()),
                )
            )
        return result

    def status(self) -> LabStatus:
        if not self.layout.state_file.exists():
            return LabStatus(self.root, running=False)
        running = self.is_running()
        return LabStatus(self.root, running=running, nodes=self.nodes() if running else [])

    def is_running(self) -> bool:
        try:
            state = self.state()
        except (LabError, ValueError, KeyError):
            return False
        return pid_alive(state.slurmctld_pid) and pid_alive(state.munged_pid)

    def delete_reservations(self) -> None:
        """Every reservation a test left (a sweep's, the spares pool, a job's spare): a
        reserved node is IDLE+RESERVED and no other test's job may land there."""
        shown = self.slurm(["scontrol", "-o", "show", "reservation"], check=False).stdout
        for name in re.findall(r"^ReservationName=(\S+)", shown, flags=re.MULTILINE):
            self.slurm(["scontrol", "delete", f"reservationname={name}"], check=False)
