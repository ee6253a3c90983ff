"""Medic's one interface to Slurm: read nodes and jobs, drain, resume, reboot, requeue,
release, comment. Reads parse `sinfo --json` / `squeue --json`; writes go through
`scontrol`. Every call is an argv list through medic_core.proc with a timeout; a failure
raises SlurmError carrying Slurm's own message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from medic_core import proc

DEFAULT_BIN_DIRS = (Path("/usr/bin"), Path("/usr/local/bin"), Path("/opt/slurm/bin"))


class SlurmError(RuntimeError):
    """A Slurm command failed or printed what Medic cannot read; one line."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # base state: IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: frozenset[str]  # DRAIN, REBOOT_REQUESTED, ...
    reason: str = ""
    reason_user: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    name: str
    user: str
    state: str
    reason: str
    nodes: str
    requeue: bool
    restart_count: int
    comment: str = ""
    admin_comment: str = ""
    partition: str = ""
    description: str = ""  # state_description: "launch failed requeued held", ...
    extra: Mapping[str, Any] = field(default_factory=dict)


class SlurmClient(Protocol):
    def nodes(self) -> list[NodeInfo]: ...

    def node(self, name: str) -> NodeInfo | None: ...

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]: ...

    def jobs_on(self, node: str) -> list[JobInfo]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None: ...

    def requeue(self, job_id: str) -> None: ...

    def release(self, job_id: str) -> None: ...

    def hold(self, job_id: str) -> None: ...

    def start_now(self, job_id: str) -> None: ...

    def set_admin_comment(self, job_id: str, text: str) -> None: ...


# --- parsing ---------------------------------------------------------------------------------


def _number(value: Any) -> int:
    """22.05 prints plain numbers; 23.02+ prints {"set": true, "number": n}."""
    if isinstance(value, Mapping):
        return int(value.get("number", 0)) if value.get("set", True) else 0
    return int(value or 0)


def _states(value: Any) -> list[str]:
    """22.05: "IDLE" plus a separate state_flags list; 23.02+: ["IDLE", "DRAIN"]."""
    if isinstance(value, list):
        return [str(v).upper() for v in value]
    return [str(value).upper()] if value else []


def _data_parser(doc: Mapping[str, Any], what: str) -> str:
    meta = doc.get("meta", {})
    plugin = meta.get("plugin", {}) or meta.get("plugins", {})
    parser = plugin.get("data_parser") or plugin.get("type") or ""
    release = meta.get("Slurm", {}).get("release") or meta.get("slurm", {}).get("release", "")
    if not parser and not release:
        raise SlurmError(f"{what}: no meta.plugin/meta.Slurm in the JSON: not Slurm's output")
    return str(parser or release)


def parse_sinfo(text: str) -> list[NodeInfo]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"sinfo --json: not JSON ({exc})") from exc
    _data_parser(doc, "sinfo --json")
    nodes = []
    for raw in doc.get("nodes", []):
        states = _states(raw.get("state"))
        flags = set(states[1:]) | {str(f).upper() for f in raw.get("state_flags", [])}
        nodes.append(
            NodeInfo(
                name=str(raw["name"]),
                state=states[0] if states else "UNKNOWN",
                flags=frozenset(flags),
                reason=str(raw.get("reason") or ""),
                reason_user=str(raw.get("reason_set_by_user") or ""),
                partitions=tuple(str(p) for p in raw.get("partitions", [])),
            )
        )
    return nodes


def parse_squeue(text: str) -> list[JobInfo]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"squeue --json: not JSON ({exc})") from exc
    _data_parser(doc, "squeue --json")
    jobs = []
    for raw in doc.get("jobs", []):
        states = _states(raw.get("job_state"))
        jobs.append(
            JobInfo(
                job_id=str(raw["job_id"]),
                name=str(raw.get("name", "")),
                user=str(raw.get("user_name", "")),
                state=states[0] if states else "UNKNOWN",
                reason=str(raw.get("state_reason", "")),
                nodes=str(raw.get("nodes", "")),
                requeue=bool(raw.get("requeue", False)),
                restart_count=_number(raw.get("restart_cnt", 0)),
                comment=str(raw.get("comment") or ""),
                admin_comment=str(raw.get("admin_comment") or ""),
                partition=str(raw.get("partition", "")),
                description=str(raw.get("state_description") or ""),
            )
        )
    return jobs


# --- the CLI backend -------------------------------------------------------------------------


class CliSlurm:
    """`SlurmClient` over Slurm's commands. Hooks get no PATH: binaries are looked up in
    `bin_dirs`; `env` carries SLURM_CONF where the caller has one."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout: float = 15.0,
        bin_dirs: Iterable[Path] = DEFAULT_BIN_DIRS,
    ) -> None:
        self.env = dict(env or {})
        self.timeout = timeout
        self.bin_dirs = tuple(bin_dirs)

    def _binary(self, name: str) -> str:
        for directory in self.bin_dirs:
            candidate = directory / name
            if candidate.is_file():
                return str(candidate)
        where = ", ".join(str(d) for d in self.bin_dirs)
        raise SlurmError(f"{name} not found in {where}: install slurm-client or set bin_dirs")

    def _run(self, name: str, *args: str) -> str:
        result = proc.run([self._binary(name), *args], timeout=self.timeout, env=self.env)
        if not result.ok:
            raise SlurmError(f"{name} {' '.join(args[:3])}: {result.describe_failure()}")
        return result.stdout

    def nodes(self) -> list[NodeInfo]:
        return parse_sinfo(self._run("sinfo", "--json"))

    def node(self, name: str) -> NodeInfo | None:
        return next((n for n in self.nodes() if n.name == name), None)

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]:
        args = ["--json"] + (["--jobs", ",".join(ids)] if ids else [])
        found = parse_squeue(self._run("squeue", *args))
        return [j for j in found if ids is None or j.job_id in ids]

    def jobs_on(self, node: str) -> list[JobInfo]:
        found = parse_squeue(self._run("squeue", "--json", "--nodelist", node))
        return [j for j in found if j.state not in ("COMPLETED", "CANCELLED", "FAILED")]

    def drain(self, node: str, reason: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=resume")

    def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        self._run("scontrol", "reboot", "ASAP", f"nextstate={nextstate}", f"reason={reason}", node)

    def requeue(self, job_id: str) -> None:
        self._run("scontrol", "requeue", job_id)

    def release(self, job_id: str) -> None:
        self._run("scontrol", "release", job_id)

    def hold(self, job_id: str) -> None:
        self._run("scontrol", "hold", job_id)

    def start_now(self, job_id: str) -> None:
        self._run("scontrol", "update", f"jobid={job_id}", "starttime=now")

    def set_admin_comment(self, job_id: str, text: str) -> None:
        self._run("scontrol", "update", f"jobid={job_id}", f"admincomment={text}")
